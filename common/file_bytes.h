// A whole file into memory, sized once and read in large blocks. A stream iterator goes byte by
// byte: on the path of a restarted worker (its flash copy and its data copy, megabytes each)
// that cost tens to hundreds of milliseconds on a loaded host.
//
// Blocks on the file system; never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlaunch {

// The file's bytes, or nullopt with the errno of the failed open or read in *err (if given).
std::optional<std::vector<uint8_t>> read_file_bytes(const std::string& path, int* err = nullptr);

}  // namespace dlaunch
