#include "launcher/process/exit_status.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>

#include <cctype>
#include <cstdlib>

namespace dlaunch {

std::string signal_name(int signal) {
  // sigabbrev_np (glibc 2.32+) gives "SEGV"; async-signal-safety is not needed here.
  if (const char* abbrev = sigabbrev_np(signal)) return std::string("SIG") + abbrev;
  return fmt::format("SIG{}", signal);
}

int parse_signal(const std::string& text) {
  if (text.empty()) return 0;
  if (std::isdigit(static_cast<unsigned char>(text[0]))) {
    char* end = nullptr;
    long v = std::strtol(text.c_str(), &end, 10);
    return (*end == '\0' && v > 0 && v < NSIG) ? static_cast<int>(v) : 0;
  }
  std::string upper;
  for (char c : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.rfind("SIG", 0) == 0) upper = upper.substr(3);
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = sigabbrev_np(s);
    if (abbrev && upper == abbrev) return s;
  }
  return 0;
}

std::string ExitStatus::describe() const {
  if (!signaled) return fmt::format("exit code {}", code);
  return fmt::format("signal {} ({}{})", signal_name(code), code, core_dumped ? ", core dumped" : "");
}

}  // namespace dlaunch
