// A stop signal that arrives before the agent handles signals (AgentSignals::install) ends
// dlaunch at once with 128 + N, as the agent itself would: nothing of the job runs yet (no
// worker is spawned before the install), so there is nothing to forward or wait for.
//
// Why a handler and not the default action: a container's PID 1 gets no signal it has no
// handler for (the kernel drops them, SIGKILL from outside aside). dlaunch as a pod's
// entrypoint may wait a long time before its agent starts (a store host that is not up yet,
// up to the join timeout); the kubelet's SIGTERM must end that wait, not the SIGKILL at the
// end of the grace period. Elsewhere the code seen is the one the default action gave
// (128 + N from a shell), with one line on stderr saying why.
//
// Async-signal-safe: the handler only write()s a prepared line and calls _exit().
#pragma once

#include <vector>

namespace dlaunch {

// Installs the handler for each of `signals` whose disposition is not SIG_IGN (a signal the
// caller ignored, nohup's SIGHUP, stays ignored, as the agent keeps it). The agent's own
// handlers replace it. Call once, early, from the main thread. Never throws.
void exit_on_early_stop_signals(const std::vector<int>& signals);

}  // namespace dlaunch
