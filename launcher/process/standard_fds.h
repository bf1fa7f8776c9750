// dlaunch started with a standard descriptor closed (`<&-`, some cron and CI runners): the next
// file the agent opens would take that number, and the workers would inherit it as their stdin
// (or stdout/stderr). Fill the gaps with /dev/null first, as daemons do.
#pragma once

namespace dlaunch {

// Opens /dev/null on each of 0, 1, 2 that is closed. Call before anything else opens a file.
// Never throws; a failure to open /dev/null leaves that descriptor closed.
void open_missing_standard_fds();

}  // namespace dlaunch
