#include "launcher/config/completion.h"

// The script fills COMPREPLY with mapfile, one candidate a line, so file names with spaces stay
// whole (COMPREPLY=($(compgen ...)) would split them).

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "launcher/config/control_commands.h"

namespace dlaunch {
namespace {

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::string bar_joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : "|") + w;
  return out;
}

std::vector<std::string> both_spellings(const std::vector<std::string>& flags) {
  std::vector<std::string> out;
  for (const auto& f : flags) {
    out.push_back(f);
    if (dashed(f) != f) out.push_back(dashed(f));
  }
  return out;
}

// "--rdzv_backend|--rdzv-backend": a case pattern matching every spelling of the flag.
std::string spellings(const FlagSpec& s) {
  std::string out = "--" + s.name;
  if (dashed(s.name) != s.name) out += "|--" + dashed(s.name);
  if (s.short_name) out += fmt::format("|-{}", s.short_name);
  return out;
}

}  // namespace

std::vector<std::string> completion_choices(const FlagSpec& spec) {
  std::vector<std::string> out;
  if (!spec.takes_value || spec.metavar.find('|') == std::string::npos) return out;
  size_t start = 0;
  while (start <= spec.metavar.size()) {
    size_t bar = spec.metavar.find('|', start);
    std::string word = spec.metavar.substr(start, bar == std::string::npos ? bar : bar - start);
    // Placeholders are upper case (N, MIN:MAX, R:S,...); literal values are lower case or digits.
    bool literal = !word.empty() && std::all_of(word.begin(), word.end(), [](unsigned char c) {
      return std::islower(c) || std::isdigit(c);
    });
    if (literal) out.push_back(word);
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

std::string bash_completion_script(const std::vector<FlagSpec>& specs) {
  std::vector<std::string> all_flags;
  std::string value_flags;  // case pattern of every flag that takes a value
  std::string value_cases;
  for (const auto& s : specs) {
    all_flags.push_back("--" + s.name);
    if (dashed(s.name) != s.name) all_flags.push_back("--" + dashed(s.name));
    if (s.short_name) all_flags.push_back(fmt::format("-{}", s.short_name));
    if (!s.takes_value) continue;
    value_flags += (value_flags.empty() ? "" : "|") + spellings(s);
    auto choices = completion_choices(s);
    std::string action;
    if (!choices.empty()) {
      action = fmt::format("mapfile -t COMPREPLY < <(compgen -W \"{}\" -- \"$cur\")", join(choices));
    } else if (s.metavar == "DIR") {
      action = "compopt -o filenames; mapfile -t COMPREPLY < <(compgen -d -- \"$cur\")";
    } else if (s.metavar == "PATH") {
      action = "compopt -o filenames; mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")";
    } else {
      action = "COMPREPLY=()";  // a number, a host, an id: nothing to offer
    }
    value_cases += fmt::format("    {}) {}; return ;;\n", spellings(s), action);
  }
  return fmt::format(
      R"(# bash completion for dlaunch. Generated at build time from the flag table in
# launcher/config/cli.cc (launcher/config/completion.cc); do not edit, rebuild.
_dlaunch() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} i w
  # --flag=value: bash splits at '=' (COMP_WORDBREAKS), giving "--flag" "=" "value".
  if [[ $cur == "=" ]]; then
    cur=""
  elif [[ $prev == "=" && $COMP_CWORD -ge 2 ]]; then
    prev=${{COMP_WORDS[COMP_CWORD-2]}}
  fi
  # dlaunch status|stop|restart|dump: their own flags.
  case ${{COMP_WORDS[1]}} in
    {control_commands_pattern})
      if ((COMP_CWORD > 1)); then
        case $prev in
          --rdzv_backend|--rdzv-backend)
            mapfile -t COMPREPLY < <(compgen -W "static c10d etcd" -- "$cur"); return ;;
          --token_file|--token-file)
            compopt -o filenames; mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
          --rdzv_endpoint|--rdzv-endpoint|--master_addr|--master-addr|--master_port|--master-port|--rdzv_id|--rdzv-id|--run_id|--run-id|--rdzv_conf|--rdzv-conf|--timeout)
            COMPREPLY=(); return ;;
        esac
        mapfile -t COMPREPLY < <(compgen -W "{control_flags}" -- "$cur")
        return
      fi ;;
  esac
  # Options end at "--" or at the first word that is not a flag or a flag's value: the
  # program. Its arguments are its own; offer files.
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${{COMP_WORDS[i]}}
    case $w in
      --) compopt -o default; COMPREPLY=(); return ;;
      {value_flags})
        if [[ ${{COMP_WORDS[i+1]}} == "=" ]]; then ((i += 2)); else ((i += 1)); fi ;;
      -*|=) ;;
      *) compopt -o default; COMPREPLY=(); return ;;
    esac
  done
  case $prev in
{value_cases}  esac
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "{all_flags}" -- "$cur")
    return
  fi
  # The program: a file or a command; first on the line, also a subcommand.
  compopt -o default
  mapfile -t COMPREPLY < <(compgen -c -- "$cur")
  if ((COMP_CWORD == 1)); then
    mapfile -t -O "${{#COMPREPLY[@]}}" COMPREPLY < <(compgen -W "{control_commands}" -- "$cur")
  fi
}}
complete -F _dlaunch dlaunch
)",
      fmt::arg("value_flags", value_flags), fmt::arg("value_cases", value_cases),
      fmt::arg("all_flags", join(all_flags)),
      fmt::arg("control_commands_pattern", bar_joined(job_control_commands())),
      fmt::arg("control_commands", join(job_control_commands())),
      fmt::arg("control_flags", join(both_spellings(job_control_flags()))));
}

}  // namespace dlaunch
