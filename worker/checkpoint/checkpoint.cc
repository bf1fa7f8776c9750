#include "worker/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include "common/byte_order.h"
#include "common/file_bytes.h"
#include "common/log.h"

namespace dlaunch::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr size_t kHeaderSize = 32;
constexpr char kFilePrefix[] = "checkpoint_epoch_";
constexpr char kFileSuffix[] = ".dtck";
constexpr char kStepMark[] = "_step_";
constexpr char kTmpMark[] = ".tmp.";

// Bounds-checked cursor: every read says what it was reading when the bytes ran out.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}
  uint32_t u32(const char* what) { return get<uint32_t>(what); }
  uint64_t u64(const char* what) { return get<uint64_t>(what); }
  const uint8_t* take(size_t n, const char* what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  template <typename T>
  T get(const char* what) {
    return load_le<T>(take(sizeof(T), what));
  }
  void need(size_t n, const char* what) {
    if (n > size_ - pos_) {
      throw CheckpointError(fmt::format("checkpoint {} is malformed: {} needs {} bytes at payload "
                                        "offset {} but only {} remain",
                                        source_, what, n, pos_, size_ - pos_));
    }
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& source_;
};

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw SystemError(errno_message("writing checkpoint " + path, errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw SystemError(errno_message("opening directory " + dir.string(), errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw SystemError(errno_message("fsync of directory " + dir.string(), err));
}

// A decimal number; nullopt when `digits` is empty, holds a non-digit or does not fit in int64.
std::optional<int64_t> parse_number(const std::string& digits, bool* overflow) {
  if (digits.empty()) return std::nullopt;
  int64_t v = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return std::nullopt;
    const int d = ch - '0';
    if (v > (std::numeric_limits<int64_t>::max() - d) / 10) {
      *overflow = true;
      return std::nullopt;
    }
    v = v * 10 + d;
  }
  return v;
}

// Where a checkpoint file name sorts: epochs done, then whether it is a stop inside the next
// epoch (after the complete one), then that stop's global step.
struct NameKey {
  int64_t epoch = 0;
  int partial = 0;
  int64_t step = 0;
  bool operator>(const NameKey& o) const {
    return std::tie(epoch, partial, step) > std::tie(o.epoch, o.partial, o.step);
  }
};

// The sort key of a checkpoint file name; nullopt for names that are not ours (or whose numbers
// do not fit in int64: such a file cannot have been written by us, and std::stoll would throw
// std::out_of_range out of --resume auto; the warning names `path`, the file).
std::optional<NameKey> key_from_name(const std::string& name, const std::string& path) {
  const size_t plen = std::strlen(kFilePrefix), slen = std::strlen(kFileSuffix);
  if (name.size() <= plen + slen || name.compare(0, plen, kFilePrefix) != 0 ||
      name.compare(name.size() - slen, slen, kFileSuffix) != 0) {
    return std::nullopt;
  }
  std::string epoch_digits = name.substr(plen, name.size() - plen - slen), step_digits;
  const size_t mark = epoch_digits.find(kStepMark);
  if (mark != std::string::npos) {
    step_digits = epoch_digits.substr(mark + std::strlen(kStepMark));
    epoch_digits.resize(mark);
  }
  bool overflow = false;
  NameKey key;
  auto epoch = parse_number(epoch_digits, &overflow);
  std::optional<int64_t> step = int64_t{0};
  if (mark != std::string::npos) step = parse_number(step_digits, &overflow);
  if (overflow) {
    // The directory is listed at every checkpoint (pruning, on the persister's thread too): the
    // warning is said once per file and process, not once per epoch.
    static std::mutex warned_mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(warned_mu);
    if (warned.insert(path).second) {
      log_warning("ignoring {}: a number in its name does not fit in 64 bits (not a dtrain "
                  "checkpoint name; rename or remove it)",
                  path);
    }
    return std::nullopt;
  }
  if (!epoch || !step) return std::nullopt;
  key.epoch = *epoch;
  key.partial = mark != std::string::npos ? 1 : 0;
  key.step = *step;
  return key;
}

// True when `pid` is a running dtrain other than this process: its temporary files may be a
// write in progress. Anything else (this process, which has not written yet, a dead pid, a pid
// reused by another program) left them behind.
bool other_live_dtrain(pid_t pid) {
  if (pid == ::getpid()) return false;
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  return std::getline(comm, name) && name.rfind("dtrain", 0) == 0;
}

}  // namespace

const std::vector<float>* Checkpoint::find(const std::string& name) const {
  for (const auto& [n, v] : arrays) {
    if (n == name) return &v;
  }
  return nullptr;
}

std::vector<uint8_t> encode_checkpoint(const Checkpoint& ckpt) {
  // Sized once and filled in place: flash copies encode the whole state every few steps, and
  // growing a vector four bytes at a time cost ~10 ns per value (a 85 MiB state took ~0.9 s).
  const std::string meta = ckpt.meta.dump();
  size_t payload_size = 4 + meta.size() + 4;
  for (const auto& [name, values] : ckpt.arrays) payload_size += 4 + name.size() + 8 + 4 * values.size();
  std::vector<uint8_t> out(kHeaderSize + payload_size);
  uint8_t* p = out.data() + kHeaderSize;
  auto put_bytes = [&p](const void* src, size_t n) {
    if (n > 0) std::memcpy(p, src, n);
    p += n;
  };
  auto put_u32 = [&p](uint32_t v) {
    store_le<uint32_t>(p, v);
    p += 4;
  };
  put_u32(static_cast<uint32_t>(meta.size()));
  put_bytes(meta.data(), meta.size());
  put_u32(static_cast<uint32_t>(ckpt.arrays.size()));
  for (const auto& [name, values] : ckpt.arrays) {
    put_u32(static_cast<uint32_t>(name.size()));
    put_bytes(name.data(), name.size());
    store_le<uint64_t>(p, values.size());
    p += 8;
    for (float v : values) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      put_u32(bits);
    }
  }
  DL_CHECK(p == out.data() + out.size()) << payload_size;
  uint8_t* h = out.data();
  std::memcpy(h, kCheckpointMagic, sizeof kCheckpointMagic);
  store_le<uint32_t>(h + 8, kCheckpointVersion);
  store_le<uint32_t>(h + 12, 0);
  store_le<uint64_t>(h + 16, payload_size);
  store_le<uint32_t>(h + 24, checkpoint_crc32(h + kHeaderSize, payload_size));
  store_le<uint32_t>(h + 28, checkpoint_crc32(h, 28));
  return out;
}

uint32_t checkpoint_crc32(const uint8_t* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), data, n));
}

Checkpoint decode_checkpoint(const std::vector<uint8_t>& bytes, const std::string& source) {
  if (bytes.size() < kHeaderSize) {
    throw CheckpointError(fmt::format("checkpoint {} is truncated: {} bytes, shorter than the {}-byte "
                                      "header",
                                      source, bytes.size(), kHeaderSize));
  }
  if (std::memcmp(bytes.data(), kCheckpointMagic, sizeof kCheckpointMagic) != 0) {
    throw CheckpointError(fmt::format("{} is not a dtrain checkpoint (the magic bytes are not "
                                      "DTRAINCK)",
                                      source));
  }
  const uint8_t* h = bytes.data();
  uint32_t version = load_le<uint32_t>(h + 8);
  uint64_t payload_size = load_le<uint64_t>(h + 16);
  uint32_t payload_crc = load_le<uint32_t>(h + 24);
  uint32_t header_crc = load_le<uint32_t>(h + 28);
  if (checkpoint_crc32(h, 28) != header_crc) {
    throw CheckpointError(fmt::format("checkpoint {} has a corrupt header (header checksum "
                                      "mismatch)",
                                      source));
  }
  if (version != kCheckpointVersion) {
    throw CheckpointError(fmt::format("checkpoint {} has format version {}; this dtrain reads "
                                      "version {}",
                                      source, version, kCheckpointVersion));
  }
  if (payload_size != bytes.size() - kHeaderSize) {
    throw CheckpointError(fmt::format("checkpoint {} is truncated or padded: the header promises "
                                      "{} payload bytes, the file holds {}",
                                      source, payload_size, bytes.size() - kHeaderSize));
  }
  const uint8_t* p = bytes.data() + kHeaderSize;
  uint32_t actual_crc = checkpoint_crc32(p, payload_size);
  if (actual_crc != payload_crc) {
    throw CheckpointError(fmt::format("checkpoint {} is corrupt: payload CRC-32 is {:08x}, the "
                                      "header says {:08x}",
                                      source, actual_crc, payload_crc));
  }
  Reader r(p, payload_size, source);
  Checkpoint ckpt;
  uint32_t meta_len = r.u32("the metadata length");
  const uint8_t* meta = r.take(meta_len, "the metadata");
  try {
    ckpt.meta = nlohmann::json::parse(meta, meta + meta_len);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint {} has unreadable metadata: {}", source, e.what()));
  }
  uint32_t n = r.u32("the array count");
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t name_len = r.u32("an array name length");
    const uint8_t* name = r.take(name_len, "an array name");
    uint64_t count = r.u64("an array length");
    if (count > r.remaining() / 4) {
      throw CheckpointError(fmt::format("checkpoint {} is malformed: array {} claims {} values but "
                                        "only {} bytes remain",
                                        source, std::string(name, name + name_len), count,
                                        r.remaining()));
    }
    const uint8_t* data = r.take(count * 4, "array values");
    std::vector<float> values(count);
    for (uint64_t k = 0; k < count; ++k) {
      uint32_t bits = load_le<uint32_t>(data + 4 * k);
      std::memcpy(&values[k], &bits, sizeof bits);
    }
    ckpt.arrays.emplace_back(std::string(name, name + name_len), std::move(values));
  }
  if (r.remaining() != 0) {
    throw CheckpointError(
        fmt::format("checkpoint {} is malformed: {} stray bytes after the last array", source,
                    r.remaining()));
  }
  return ckpt;
}

void write_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  write_checkpoint_bytes(path, encode_checkpoint(ckpt), Durability::kFsync);
}

void write_checkpoint_bytes(const std::string& path, const std::vector<uint8_t>& bytes,
                            Durability durability) {
  const bool sync = durability == Durability::kFsync;
  fs::path target(path);
  fs::path tmp = target;
  tmp += fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SystemError(errno_message("creating checkpoint " + tmp.string(), errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp.string());
    if (sync && ::fsync(fd) != 0) throw SystemError(errno_message("fsync of " + tmp.string(), errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError(errno_message("renaming " + tmp.string() + " to " + path, err));
  }
  if (sync) fsync_dir(target.parent_path());
}

Checkpoint read_checkpoint(const std::string& path) {
  int err = 0;
  std::optional<std::vector<uint8_t>> bytes = read_file_bytes(path, &err);
  if (!bytes) throw CheckpointError(errno_message("cannot read checkpoint " + path, err));
  return decode_checkpoint(*bytes, path);
}

std::string checkpoint_file_name(int64_t epoch) {
  return fmt::format("{}{:04d}{}", kFilePrefix, epoch, kFileSuffix);
}

std::string partial_checkpoint_file_name(int64_t epochs_done, int64_t global_step) {
  return fmt::format("{}{:04d}{}{:08d}{}", kFilePrefix, epochs_done, kStepMark, global_step,
                     kFileSuffix);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<NameKey, std::string>> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return {};  // nothing written yet
  auto fail = [&](const std::string& doing) {
    throw CheckpointError(fmt::format("cannot {} checkpoint directory {}: {}; fix its permissions or "
                                      "pass another --output_dir (or --resume none)",
                                      doing, dir, ec.message()));
  };
  if (ec) fail("open");
  for (fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) fail("read");
    const auto key = key_from_name(it->path().filename().string(), it->path().string());
    if (!key) continue;
    // A name of ours that is not a regular file (a directory, a dangling link) cannot be a
    // checkpoint; an error asking is an unreadable directory entry.
    const bool regular = it->is_regular_file(ec);
    if (ec) fail("inspect " + it->path().filename().string() + " in");
    if (regular) found.emplace_back(*key, it->path().string());
  }
  if (ec) fail("read");
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

void require_arrays(const Checkpoint& ckpt, const std::string& source,
                    const std::vector<std::pair<std::string, size_t>>& expected) {
  for (const auto& [name, size] : expected) {
    const std::vector<float>* values = ckpt.find(name);
    if (values == nullptr) {
      throw CheckpointError(fmt::format("checkpoint {} has no '{}' array, which this model needs "
                                        "({} values); it was written by another dtrain or damaged: "
                                        "resume from another checkpoint or start with --resume none",
                                        source, name, size));
    }
    if (values->size() != size) {
      throw CheckpointError(fmt::format("checkpoint {} holds {} values in '{}'; this model needs {}: "
                                        "resume from another checkpoint or start with --resume none",
                                        source, values->size(), name, size));
    }
  }
}

std::optional<LoadedCheckpoint> load_latest_valid(const std::string& dir) {
  for (const std::string& path : list_checkpoints(dir)) {
    try {
      return LoadedCheckpoint{path, read_checkpoint(path)};
    } catch (const CheckpointError& e) {
      log_warning("skipping checkpoint {}: {}", path, e.what());
    }
  }
  return std::nullopt;
}

std::string CheckpointFile::run_id() const {
  const auto it = meta.find("run_id");
  return it != meta.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<CheckpointFile> scan_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> files;
  for (const std::string& path : list_checkpoints(dir)) {
    CheckpointFile f;
    f.path = path;
    try {
      f.meta = read_checkpoint(path).meta;
      f.valid = true;
    } catch (const CheckpointError& e) {
      f.error = e.what();
    }
    files.push_back(std::move(f));
  }
  return files;
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t mark = name.rfind(kTmpMark);
    if (mark == std::string::npos || !key_from_name(name.substr(0, mark), it->path().string())) continue;
    bool overflow = false;
    const auto pid = parse_number(name.substr(mark + std::strlen(kTmpMark)), &overflow);
    if (!pid || *pid > std::numeric_limits<pid_t>::max()) continue;
    if (other_live_dtrain(static_cast<pid_t>(*pid))) {
      log_warning("leaving {}: process {} is a running dtrain that may still be writing it (two "
                  "dtrain runs share this --output_dir?)",
                  it->path().string(), *pid);
      continue;
    }
    std::error_code rm;
    fs::remove(it->path(), rm);
    if (rm) {
      log_warning("could not delete the leftover temporary file {}: {}", it->path().string(),
                  rm.message());
    } else {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

void prune_checkpoints(const std::string& dir, size_t keep, const std::string& run_id) {
  std::vector<CheckpointFile> files;
  try {
    files = scan_checkpoints(dir);
  } catch (const CheckpointError& e) {
    log_warning("not pruning old checkpoints: {}", e.what());
    return;
  }
  size_t kept = 0;
  for (const CheckpointFile& f : files) {
    if (!f.valid || f.run_id() != run_id) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(f.path, ec);
    if (ec) log_warning("could not delete old checkpoint {}: {}", f.path, ec.message());
  }
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &utc);
  return fmt::format("{}-{:016x}", when, r);
}

}  // namespace dlaunch::ckpt
