// The signals that arrive before the agent handles them (AgentSignals::install). Nothing of
// the job runs yet (no worker is spawned before the install), so there is nothing to forward
// or wait for:
//   - a stop signal N ends dlaunch at once with 128 + N, as the agent would;
//   - SIGUSR1, the preemption notice, ends it with 75 (requeue), as the agent does once its
//     workers have stopped;
//   - SIGUSR2, which the agent only forwards, does nothing.
// Each writes one line on stderr saying so.
//
// Why handlers and not the default actions: a container's PID 1 gets no signal it has no
// handler for (the kernel drops them; SIGKILL from outside aside). dlaunch as a pod's
// entrypoint may wait long before its agent starts (a store host that is not up yet, up to the
// join timeout); the kubelet's SIGTERM must end that wait, not the SIGKILL at the end of the
// grace period. Elsewhere a stop signal gives the code its default action gave (128 + N as a
// shell sees it), and SIGUSR1/SIGUSR2 no longer kill dlaunch with 138/140.
//
// Handlers, not SIG_IGN: they are reset by exec (the program check's probe, a Slurm task
// becoming its worker), where an ignored signal would stay ignored. Async-signal-safe: a
// handler only write()s a prepared line and calls _exit().
#pragma once

#include <vector>

namespace dlaunch {

// Installs the handlers above for `stop_signals` (LaunchConfig::stop_signals; those whose
// default action does not end a process, SIGCHLD or SIGTSTP, are left alone), SIGUSR1 and
// SIGUSR2, except where the disposition is SIG_IGN (a signal the caller ignored, nohup's
// SIGHUP, stays ignored, as the agent keeps it). The agent's own handlers replace them. Call
// once, early, from the main thread. Never throws.
void handle_signals_before_the_agent(const std::vector<int>& stop_signals);

}  // namespace dlaunch
