// Preemption (docs/dtrain.md, "Preemption"): SIGUSR1 (Slurm's notice, forwarded by dlaunch),
// SIGTERM and SIGINT (Ctrl-C) ask dtrain to finish the step in progress, write a checkpoint and
// exit, instead of dying with the work since the last epoch.
//
// install_stop_signals() blocks these signals in the calling thread: call it first in main, so
// every thread main starts (training, data, gloo, communication) inherits the mask and none of
// their system calls is interrupted. One dedicated thread takes the signals with sigwait(); a
// handler covers threads started before main (OpenBLAS's pool). While the trainer is not armed
// (start-up, before there is any work worth saving) a signal ends the process at once by its
// default action, as before; armed, a signal only records the request (the first one's number;
// repeats change nothing: Slurm may deliver the notice twice, once itself and once through
// dlaunch). A second SIGINT ends the process at once (Ctrl-C twice: the user will not wait).
//
// A worker that cannot reach its step boundary (blocked in a collective with a lost peer) is
// ended by the stop watchdog (stop_watchdog.h), run by the signal thread: by the same signal's
// default action, as if it had not been armed, a bounded time after the signal, instead of
// waiting for the launcher's SIGKILL.
#pragma once

#include <cstdint>
#include <optional>

#include "common/clock.h"

namespace dlaunch::train {

void install_stop_signals();
// Whether a signal should record a stop request (true) or end the process (false).
void arm_stop_signals(bool armed);
// 0 while no stop was requested, else the signal's number. Lock-free; any thread.
int stop_requested();
// "SIGUSR1", "SIGTERM", "SIGINT".
const char* stop_signal_name(int sig);

// Starts the stop watchdog for a trainer that agrees on stops every `steps_per_check` steps
// under a launcher whose --shutdown_grace is `grace` (none: not known). Call before arming,
// once per process (later calls change nothing); without it a stop waits for the step boundary
// however long that takes.
void watch_stop_signals(int64_t steps_per_check, std::optional<Duration> grace);
// Training thread: tells the watchdog a step ended (step = true) or an evaluation batch did.
void stop_watch_progress(bool step);
// Training thread: the worker ends by itself from here (the ranks agreed to stop, or training
// is over); the watchdog gives up on nothing any more.
void stop_watch_settle();

}  // namespace dlaunch::train
