// dlaunch_completion_gen: prints dlaunch's bash completion script (completion.h). Run by the
// build, not installed; dlaunch itself gets no hidden flag for it.
#include <cstdio>

#include "launcher/config/cli.h"
#include "launcher/config/completion.h"

int main() {
  std::fputs(dlaunch::bash_completion_script(dlaunch::flag_specs()).c_str(), stdout);
  return 0;
}
