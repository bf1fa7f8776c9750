// The bash completion script for dlaunch, generated from the flag table (cli.h) so it cannot go
// stale: a flag added to flag_specs() is completed by the next build. The build writes it with
// dlaunch_completion_gen (launcher/completion_main.cc) and installs it as
// share/bash-completion/completions/dlaunch. Pure text; touches nothing.
//
// What it completes: both spellings of every long flag and the short ones; a flag's values where
// its metavar lists words ("static|c10d|etcd", "N|cpu|gpu|auto" -> cpu gpu auto, "0|1|2|3|R:S,..."
// -> 0 1 2 3), directories for DIR, files for PATH; after the program, files (the program's
// own arguments are not dlaunch's to know).
#pragma once

#include <string>
#include <vector>

#include "launcher/config/cli.h"

namespace dlaunch {

// The words a flag's value completes to: the lowercase words of a '|' list; none otherwise.
std::vector<std::string> completion_choices(const FlagSpec& spec);

// The whole script, for `source` or bash-completion's completions/ directory.
std::string bash_completion_script(const std::vector<FlagSpec>& specs);

}  // namespace dlaunch
