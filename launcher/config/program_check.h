// Before anything starts: can the program be run at all? A worker that cannot find its script
// fails the same way on every attempt, so restarting it (`dlaunch --max_restarts 2 trian.py`)
// would only spend the budget and end in exit 1; found here, it is a usage error (exit 2, no
// restart spent, one sentence saying what is missing and where it was looked for).
//
// Only what is certain is reported; anything this cannot decide passes, and the worker's own
// error (or the spawn's) says the rest:
//   - a .py program (run under the interpreter): it must exist, relative to the working
//     directory the workers inherit; a directory only when it holds __main__.py (python runs
//     those); a close name in the same directory is suggested;
//   - -m pkg.mod: the interpreter must find the top-level package `pkg` on its path
//     (importlib.util.find_spec, which imports nothing for a top-level name); deeper parts are
//     not checked: that would import the package, which can take seconds (torch);
//   - a program run directly: a bare name must be on PATH, a path must exist and must not be a
//     directory (exec fails with EACCES on one, whose generic advice, "chmod +x", is wrong there).
// Executability itself is left to the spawn, which reports the errno with the path.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "launcher/config/launch_config.h"

namespace dlaunch {

// Whether `python` finds the top-level module `name`: true, false, or nullopt when it cannot
// tell (the interpreter is missing, crashed or took too long). Blocks up to its own timeout.
using ModuleFinder =
    std::function<std::optional<bool>(const std::string& python, const std::string& name)>;

struct ProgramCheckEnv {
  std::string cwd;           // the workers' working directory
  std::string path;          // PATH, for bare program names and the interpreter
  ModuleFinder find_module;  // unset: -m is not checked
};

// The environment of this process, with a ModuleFinder that runs the interpreter (10 s at most).
ProgramCheckEnv current_program_check_env();

// nullopt when nothing is known to be wrong, else the message for the user.
std::optional<std::string> check_program(const LaunchConfig& cfg, const ProgramCheckEnv& env);

}  // namespace dlaunch
