#include "launcher/hang/stack_capture.h"

#include "launcher/process/posix_process_context.h"

namespace dlaunch {

std::vector<std::string> stack_capture_command(int pid, const std::string& path) {
  if (auto eu = resolve_program("eu-stack", path); !eu.empty()) {
    return {eu, "-p", std::to_string(pid)};
  }
  if (auto gdb = resolve_program("gdb", path); !gdb.empty()) {
    return {gdb, "-batch", "-nx", "-p", std::to_string(pid), "-ex", "thread apply all bt"};
  }
  return {};
}

std::string first_lines(const std::string& text, size_t n) {
  std::string out;
  size_t pos = 0;
  for (size_t i = 0; i < n && pos < text.size(); ++i) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out += "    " + text.substr(pos, end - pos) + "\n";
    pos = end + 1;
  }
  return out;
}

}  // namespace dlaunch
