// dlaunch's exit codes: what the agent ends with, and what a scheduler or a parent launcher reads.
#pragma once

namespace dlaunch {

namespace exit_codes {
inline constexpr int kSuccess = 0;
inline constexpr int kWorkersFailed = 1;  // torchrun's code for a failed job
inline constexpr int kUsage = 2;          // bad flags, or a program that cannot be executed
inline constexpr int kPreempted = 75;     // EX_TEMPFAIL: stopped after a preemption notice; requeue
// EX_CONFIG: the nodes' settings disagree (rendezvous_handler.h's NodeMismatchError); starting
// them again the same way cannot help.
inline constexpr int kNodeMismatch = 78;
inline constexpr int kSignalBase = 128;  // + N: the agent was stopped by signal N
}  // namespace exit_codes

}  // namespace dlaunch
