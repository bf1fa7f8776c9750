#include "worker/data/file_tree.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "worker/data/dataset.h"

namespace dlaunch::data {
namespace fs = std::filesystem;
namespace {

std::string normalise(std::string p) {
  while (p.rfind("./", 0) == 0) p.erase(0, 2);
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p;
}

void add_parents(FileTree& t, const std::string& path) {
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    t.dirs.insert(path.substr(0, slash));
  }
}

void read_directory(FileTree& t) {
  const fs::path root(t.root);
  std::error_code ec;
  // Symlinked folders are followed, as torchvision's os.walk(followlinks=True) does.
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec),
      end;
  // The iterator's paths all start with the root as given: cutting it off is the relative path
  // (fs::relative would canonicalise every one of them, a few system calls per file).
  const size_t cut = it == end ? 0 : root.string().size() + (root.string().back() == '/' ? 0 : 1);
  for (; !ec && it != end; it.increment(ec)) {
    const std::string rel = it->path().generic_string().substr(cut);
    // What a link leads to; a link to nothing (or a loop of links) is no error of the listing.
    std::error_code target_ec;
    const fs::file_status target = it->status(target_ec);
    if (target_ec && it->is_symlink(ec)) {
      t.files.push_back({rel, it->path().string(), {}, /*unread_link=*/true});
      add_parents(t, rel);
    } else if (target_ec) {
      ec = target_ec;
    } else if (fs::is_directory(target)) {
      t.dirs.insert(rel);
    } else if (fs::is_regular_file(target)) {
      t.files.push_back({rel, it->path().string(), {}});
      add_parents(t, rel);
    }
  }
  if (ec) {
    throw DataError(
        fmt::format("cannot list the dataset directory {}: {}; expected a readable "
                    "folder holding train/ and test/",
                    t.root, ec.message()));
  }
  std::sort(t.files.begin(), t.files.end(),
            [](const TreeFile& a, const TreeFile& b) { return a.path < b.path; });
}

void read_archive(FileTree& t, const std::function<bool(const std::string&)>& want) {
  std::unique_ptr<archive, int (*)(archive*)> a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  const std::string expected =
      "expected a directory or a .tar, .tar.gz or .tgz archive holding train/ and test/ (one "
      "sub-folder per class)";
  if (archive_read_open_filename(a.get(), t.root.c_str(), 1 << 20) != ARCHIVE_OK) {
    throw UsageError(
        fmt::format("--data_dir={} is a file but not a tar archive, or unreadable "
                    "(libarchive: {}); {}",
                    t.root, archive_error_string(a.get()), expected));
  }
  std::string last = "(none yet)";
  archive_entry* entry = nullptr;
  for (bool first = true;; first = false) {
    const int rc = archive_read_next_header(a.get(), &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN) {
      if (first) {
        throw UsageError(
            fmt::format("--data_dir={} is a file but not a tar archive (libarchive: {}); {}",
                        t.root, archive_error_string(a.get()), expected));
      }
      throw DataError(
          fmt::format("archive {} is damaged after member {}: {}; download or pack it "
                      "again",
                      t.root, last, archive_error_string(a.get())));
    }
    const char* name = archive_entry_pathname(entry);
    last = name != nullptr ? name : "(unnamed)";
    const std::string path = normalise(last);
    if (path.empty()) continue;
    const auto type = archive_entry_filetype(entry);
    if (type == AE_IFDIR) {
      t.dirs.insert(path);
      add_parents(t, path);
      continue;
    }
    if (type == AE_IFLNK) {  // not followed inside the archive: counted as ignored
      add_parents(t, path);
      t.files.push_back({path, {}, {}, /*unread_link=*/true});
      continue;
    }
    if (type != AE_IFREG) continue;
    add_parents(t, path);
    TreeFile f{path, {}, {}};
    if (want(path)) {
      const la_int64_t size = archive_entry_size(entry);
      f.bytes.resize(static_cast<size_t>(std::max<la_int64_t>(size, 0)));
      size_t got = 0;
      while (got < f.bytes.size()) {
        const la_ssize_t n = archive_read_data(a.get(), f.bytes.data() + got, f.bytes.size() - got);
        if (n < 0) {
          throw DataError(
              fmt::format("archive {} is damaged in member {}: {}; download or pack it "
                          "again",
                          t.root, last, archive_error_string(a.get())));
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      if (got != f.bytes.size()) {
        throw DataError(
            fmt::format("archive {} ends inside member {} ({} of its {} bytes); the "
                        "archive is truncated: download or pack it again",
                        t.root, last, got, f.bytes.size()));
      }
    }
    t.files.push_back(std::move(f));
  }
}

}  // namespace

FileTree read_file_tree(const std::string& root,
                        const std::function<bool(const std::string&)>& want) {
  FileTree t;
  t.root = root;
  std::error_code ec;
  const auto status = fs::status(root, ec);
  if (fs::is_directory(status)) {
    read_directory(t);
  } else if (fs::is_regular_file(status)) {
    t.archive = true;
    read_archive(t, want);
  } else {
    throw UsageError(fmt::format(
        "--data_dir={} {}; expected a directory or a .tar, .tar.gz or "
        ".tgz archive holding train/ and test/",
        root, fs::exists(status) ? "is neither a directory nor a file" : "does not exist"));
  }
  return t;
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  // POSIX calls, not an ifstream: tens of thousands of small files make its set-up cost show.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw DataError(fmt::format("cannot open image file {}: {}; check it exists and is readable",
                                path, std::strerror(errno)));
  }
  struct stat st {};
  std::vector<uint8_t> bytes;
  if (::fstat(fd, &st) == 0) bytes.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "end of file";
      ::close(fd);
      throw DataError(fmt::format("reading image file {} failed after {} of {} bytes: {}", path,
                                  got, bytes.size(), why));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace dlaunch::data
