// dlaunch's whole program: parse, resolve, then run the agent (or `dlaunch status|stop|...`).
// Usage errors exit 2 with one sentence; nothing here prints a stack trace. main.cc calls it;
// so does a test binary that registers a rendezvous backend of its own first
// (tests/rendezvous/fake_backend/).
#pragma once

namespace dlaunch {

// Returns the process's exit code.
int dlaunch_main(int argc, char** argv);

}  // namespace dlaunch
