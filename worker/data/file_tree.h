// The files under a dataset root: a directory, or a tar archive read in place (libarchive, any
// compression it recognises by content: gzip, bzip2, xz, zstd, none). Nothing is unpacked to
// disk: archive members the caller wants are read into memory (image datasets are mostly
// compressed JPEG, a small fraction of their decoded size), directory files are only listed and
// read later by whoever decodes them (in parallel).
//
// Blocks on file I/O. Throws UsageError (dtrain exits 2) when the root is neither a directory nor
// a tar archive, DataError when an archive breaks part way (naming the member).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace dlaunch::data {

struct TreeFile {
  std::string path;            // relative to the root, '/'-separated, no leading "./"
  std::string disk_path;       // directory roots: the file to read; empty for archive members
  std::vector<uint8_t> bytes;  // archive members accepted by `want`; empty otherwise
  // A symbolic link that is not read: one leading nowhere in a directory (one that leads to a
  // file is followed, as torchvision does), and any symlink member of an archive. Listed so that
  // it is counted among the files ignored, the same in a folder and in its tarball.
  bool unread_link = false;
};

struct FileTree {
  std::string root;  // as given
  bool archive = false;
  std::vector<TreeFile> files;  // in the order found (sorted for directories)
  std::set<std::string> dirs;   // every directory, listed or implied by a file's path
};

// `want(path)` says which archive members to read into memory.
FileTree read_file_tree(const std::string& root,
                        const std::function<bool(const std::string&)>& want);

// Reads a whole file (a directory tree's member). Throws DataError naming it.
std::vector<uint8_t> read_whole_file(const std::string& path);

}  // namespace dlaunch::data
