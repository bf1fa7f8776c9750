// Before a job's flash directory goes, the training state in it that exists nowhere else is
// written to disk. A worker asks for it by writing `<flash dir>/<name>/.persist_to`, holding the
// absolute path of a directory (dtrain: its --output_dir); when the job ends other than in
// success (a failure, a stop whose checkpoint was cut short, Ctrl-C), every file of `<name>/`
// that the target does not hold yet (by name; files starting with '.' or "data_" excepted: the
// request and cached datasets) is copied there durably (temporary file, fsync, rename). The
// worker's own resume then finds it as it finds its checkpoints.
//
// Blocks on the file system; never throws (what cannot be copied is logged, nothing else fails).
#pragma once

#include <string>
#include <vector>

namespace dlaunch {

inline constexpr const char kPersistRequestFile[] = ".persist_to";

// Copies what `flash_dir`'s persist requests ask for; returns the paths written.
std::vector<std::string> persist_flash_state(const std::string& flash_dir);

}  // namespace dlaunch
