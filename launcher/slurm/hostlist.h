// Slurm hostlist expansion without calling scontrol: SLURM_JOB_NODELIST and
// SLURM_STEP_NODELIST arrive compressed ("gpu-[01-04,07],login[1-2]") and dlaunch needs the
// first host (the master) and sometimes the whole list, on nodes where scontrol may be absent
// or may need a controller to answer.
//
// Grammar (Slurm 22.05's hostlist_create, checked against `scontrol show hostnames`):
//   list   := item { sep item }          sep: ',' ' ' '\t' '\n' outside brackets; empty items
//                                         are skipped ("a,,b" is a, b)
//   item   := text { '[' ranges ']' text }
//   ranges := range { ',' range }        ',' inside brackets separates ranges, not hosts
//   range  := digits [ '-' digits ]      lo <= hi; the width of `lo` is the zero padding:
//                                         [01-10] gives 01..10, [1-10] gives 1..10,
//                                         [001-10] gives 001..010
// Several bracket groups expand as a cartesian product in Slurm's order: the last group varies
// fastest, then the first, the second, ..., the second-to-last slowest:
//   rack[1-2]-n[01-02] -> rack1-n01 rack1-n02 rack2-n01 rack2-n02
//   a[1-2]b[3-4]c[5-6] -> a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 a1b4c6 a2b4c5 a2b4c6
// Output keeps Slurm's order and duplicates.
//
// One extension: Slurm rejects text after the last bracket group ("x[1-2]y"); we expand it to
// x1y x2y. Slurm never produces such lists itself, so this only makes hand-written lists work.
//
// Pure functions: no I/O, never block. Malformed input throws UsageError naming the input, the
// position (0-based, counted in bytes) and what was expected there.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch {

// The most hosts one hostlist may expand to; more is almost surely a typo ("n[1-100000000]").
inline constexpr size_t kMaxHostlistHosts = 1 << 20;

// Every host in `hostlist`, in order. Throws UsageError on malformed input or when the list
// expands to more than kMaxHostlistHosts names. An empty or all-separator list gives {}.
std::vector<std::string> expand_hostlist(std::string_view hostlist);

// The first host of `hostlist` (the rendezvous master under Slurm). The whole list is still
// validated. Throws UsageError when malformed or empty.
std::string first_host(std::string_view hostlist);

}  // namespace dlaunch
