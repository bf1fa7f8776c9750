// The decoded (or generated) train and test splits kept in dlaunch's flash directory, so a
// worker restarted by dlaunch skips loading its data: generating the synthetic set or decoding an
// image folder takes seconds, reading this copy from memory a few milliseconds. The copy lives
// as long as the job's flash directory (the job); data changed on disk during a job is not seen
// by restarted workers.
//
// File: <dir>/data_<16 hex digits of the key's hash>.bin, written atomically (temporary file,
// rename) by whoever loaded the data first; layout (little-endian): "DTSPLIT1", u64 meta length,
// meta (JSON: the key and both splits' fields but pixels and labels), then per split (train,
// test) u64 pixel count, pixels, u64 label count, labels, then a CRC-32 of everything before it.
//
// Blocks on the file system. Never throws: a missing, foreign or damaged copy reads as nullopt
// (damage with a warning) and a failed write (ENOSPC past --flash_limit) is a warning.
#pragma once

#include <optional>
#include <string>

#include "worker/data/dataset.h"

namespace dlaunch::data {

// What identifies a load: the same key, the same splits (before any truncation for tests).
std::string split_cache_key(const std::string& dataset, const std::string& data_dir, uint64_t seed,
                            const ImageFolderOptions& options);

std::optional<DatasetSplits> read_split_cache(const std::string& dir, const std::string& key);
void write_split_cache(const std::string& dir, const std::string& key, const DatasetSplits& splits);

}  // namespace dlaunch::data
