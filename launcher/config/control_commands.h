// The command line of `dlaunch status|stop|restart|dump` (job_control.h runs them): the
// subcommands and the flags they take, shared by dlaunch's dispatch and the bash completion
// (completion.h).
#pragma once

#include <string>
#include <vector>

namespace dlaunch {

// Whether argv[1] names one of the subcommands.
bool is_job_control_command(const std::string& word);
// The subcommands, and the flags they take (one spelling each; '_' or '-' both work), for the
// bash completion.
const std::vector<std::string>& job_control_commands();
const std::vector<std::string>& job_control_flags();

}  // namespace dlaunch
