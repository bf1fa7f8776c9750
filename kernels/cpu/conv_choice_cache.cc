#include "kernels/cpu/conv_choice_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/env.h"
#include "common/log.h"

namespace dlaunch::kernels::cpu {
namespace fs = std::filesystem;

namespace {

constexpr char kHeader[] = "dlaunch-conv-choices 1";

uint64_t fnv1a(const std::string& s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ull;
  return h;
}

bool plain_token(const std::string& t) {
  if (t.empty() || t.size() > 512) return false;
  for (char c : t)
    if (c <= ' ' || c > '~') return false;
  return true;
}

// Holds an exclusive flock on "<path>.lock" for its lifetime (no lock when it cannot be opened:
// then concurrent writers may drop each other's new entries, which only costs a re-tune).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

ConvChoiceCache::ConvChoiceCache(std::string path) : path_(std::move(path)) {}

std::map<std::string, std::string> ConvChoiceCache::parse(const std::string& text) {
  const size_t end_line = text.rfind("\nend ");
  if (text.compare(0, std::strlen(kHeader) + 1, std::string(kHeader) + "\n") != 0)
    throw std::runtime_error("it does not start with '" + std::string(kHeader) + "'");
  if (end_line == std::string::npos || text.empty() || text.back() != '\n')
    throw std::runtime_error("it has no 'end' line (truncated?)");
  std::istringstream trailer(text.substr(end_line + 1));
  std::string word, sum_hex, extra;
  size_t count = 0;
  if (!(trailer >> word >> count >> sum_hex) || (trailer >> extra))
    throw std::runtime_error("its 'end' line is malformed");
  std::ostringstream want;
  want << std::hex << fnv1a(text, end_line + 1);
  if (sum_hex != want.str()) throw std::runtime_error("its checksum does not match (damaged or edited)");
  std::map<std::string, std::string> entries;
  std::istringstream body(text.substr(std::strlen(kHeader) + 1, end_line - std::strlen(kHeader)));
  std::string line;
  while (std::getline(body, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string key, variant;
    if (!(fields >> key >> variant) || (fields >> extra) || !plain_token(key) || !plain_token(variant))
      throw std::runtime_error("line '" + line.substr(0, 80) + "' is not '<key> <variant>'");
    entries[key] = variant;
  }
  if (entries.size() != count)
    throw std::runtime_error("it holds " + std::to_string(entries.size()) + " records, its 'end' line says " +
                             std::to_string(count));
  return entries;
}

std::string ConvChoiceCache::serialize(const std::map<std::string, std::string>& entries) {
  std::string text = std::string(kHeader) + "\n";
  for (const auto& [key, variant] : entries) text += key + " " + variant + "\n";
  std::ostringstream trailer;
  trailer << "end " << entries.size() << " " << std::hex << fnv1a(text, text.size()) << "\n";
  return text + trailer.str();
}

std::string ConvChoiceCache::default_path() {
  if (auto v = get_env("DLAUNCH_CONV_CACHE")) return *v == "off" ? std::string() : *v;
  if (auto xdg = get_env("XDG_CACHE_HOME"); xdg && !xdg->empty()) return *xdg + "/dlaunch/conv_choices.txt";
  if (auto home = get_env("HOME"); home && !home->empty()) return *home + "/.cache/dlaunch/conv_choices.txt";
  return {};
}

void ConvChoiceCache::load_file() {
  if (path_.empty()) return;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return;  // not written yet (or unreadable: then we cannot use it anyway)
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    for (auto& [key, variant] : parse(ss.str())) entries_.emplace(key, variant);
  } catch (const std::exception& e) {
    if (!warned_corrupt_) {
      log_warning("ignoring the convolution choice cache {}: {}; convolutions are autotuned again "
                  "and the file is rewritten",
                  path_, e.what());
      warned_corrupt_ = true;
    }
  }
}

std::optional<std::string> ConvChoiceCache::lookup(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    load_file();
    it = entries_.find(key);
  }
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void ConvChoiceCache::record(const std::string& key, const std::string& variant) {
  entries_[key] = variant;
  if (path_.empty() || !writable_) return;
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  FileLock lock(path_);
  // Merge what others wrote since our last read; ours win for our keys.
  std::map<std::string, std::string> ours = entries_;
  load_file();
  for (auto& [k, v] : ours) entries_[k] = v;
  const std::string text = serialize(entries_);
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      log_warning("cannot write the convolution choice cache {} ({}); choices are kept for this "
                  "process only (set DLAUNCH_CONV_CACHE to another file, or off)",
                  path_, std::strerror(errno));
      writable_ = false;
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    log_warning("cannot replace the convolution choice cache {} ({}); choices are kept for this "
                "process only",
                path_, std::strerror(errno));
    writable_ = false;
    std::remove(tmp.c_str());
  }
}

}  // namespace dlaunch::kernels::cpu
