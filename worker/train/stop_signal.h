// Preemption (docs/dtrain.md, "Preemption"): SIGUSR1 (Slurm's notice, forwarded by dlaunch) and
// SIGTERM ask dtrain to finish the step in progress, write a checkpoint and exit, instead of
// dying with the work since the last epoch.
//
// install_stop_signals() blocks both signals in the calling thread: call it first in main, so
// every thread main starts (training, data, gloo, communication) inherits the mask and none of
// their system calls is interrupted. One dedicated thread takes the signals with sigwait(); a
// handler covers threads started before main (OpenBLAS's pool). While the trainer is not armed
// (start-up, before there is any work worth saving) a signal ends the process at once by its
// default action, as before; armed, a signal only records the request (the first one's number;
// repeats change nothing: Slurm may deliver the notice twice, once itself and once through
// dlaunch). SIGINT (Ctrl-C) still stops at once.
#pragma once

namespace dlaunch::train {

void install_stop_signals();
// Whether a signal should record a stop request (true) or end the process (false).
void arm_stop_signals(bool armed);
// 0 while no stop was requested, else the signal's number. Lock-free; any thread.
int stop_requested();
// "SIGUSR1", "SIGTERM".
const char* stop_signal_name(int sig);

}  // namespace dlaunch::train
