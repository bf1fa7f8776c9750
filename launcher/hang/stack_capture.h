// Which tool captures a hung worker's stacks, and how the result is summarised. The agent runs
// the command through its process context (bounded by a timeout) and writes the output to the
// worker's stack.txt; docs/troubleshooting.md tells users what to install.
//
// Preference: eu-stack (elfutils: fast, no symbols server, every thread), then gdb in batch
// mode ("thread apply all bt"). Pure functions apart from looking the tools up in `path`.
#pragma once

#include <string>
#include <vector>

namespace dlaunch {

// The argv that prints every thread's stack of `pid`, or empty when neither tool is in `path`
// (a colon-separated PATH).
std::vector<std::string> stack_capture_command(int pid, const std::string& path);

// The first `n` lines of `text`, each indented by four spaces, for the log.
std::string first_lines(const std::string& text, size_t n);

}  // namespace dlaunch
