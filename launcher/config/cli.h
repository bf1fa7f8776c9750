// Command-line parsing for dlaunch: argv -> CliArgs, with no process state touched (no env, no
// files), so every rule is unit-testable. Resolving the values (env twins, defaults, host facts)
// is launch_config.h's job.
//
// Accepted shapes, as torchrun's argparse accepts them:
//   --nproc_per_node 2   --nproc_per_node=2   --nproc-per-node 2   --nproc 2 (unique prefix)
//   -r 3   -r3   -r=3   -m   --standalone   --standalone=false
// Options end at the first token that does not start with '-' (the program) or at "--"; every
// token after the program belongs to the program, even if it looks like a dlaunch flag.
//
// Errors: throws UsageError with one sentence naming the flag, the value and what is allowed.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dlaunch {

struct FlagSpec {
  std::string name;      // canonical, underscore spelling: "nproc_per_node"
  char short_name;       // 'r', 't', 'm', 'h' or 0
  bool takes_value;      // false: a switch ("--standalone", or "--standalone=0")
  std::string env;       // the DLAUNCH_* twin: "DLAUNCH_NPROC_PER_NODE"
  std::string fallback;  // the default, as text ("" = none)
  std::string metavar;   // for --help: "N|cpu|gpu|auto"
  std::string help;
};

// Every flag dlaunch knows, in --help order.
const std::vector<FlagSpec>& flag_specs();
// The spec for a canonical name; throws InternalError for an unknown name (a bug).
const FlagSpec& flag_spec(const std::string& name);

struct CliArgs {
  // Canonical flag name -> the text given on the command line (switches: "true"/"false" or the
  // text after '='). Only flags that appeared; a repeated flag keeps its last value (argparse).
  std::map<std::string, std::string> values;
  // How each flag was spelled, for messages: "nproc_per_node" -> "--nproc-per-node".
  std::map<std::string, std::string> spelled;
  std::string program;                    // empty when none was given
  std::vector<std::string> program_args;  // everything after the program
  bool help = false;
};

// Parses argv[1..]; `args` excludes the program name of dlaunch itself.
CliArgs parse_cli(const std::vector<std::string>& args);

// The --help text.
std::string help_text();

// The candidate closest to `word` (edit distance, '-' and '_' alike), or "" when none is close
// enough to be a likely typo. For "did you mean ...?" hints.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dlaunch
