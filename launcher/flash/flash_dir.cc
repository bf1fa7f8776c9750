#include "launcher/flash/flash_dir.h"

#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "launcher/flash/flash_sweep.h"

namespace dlaunch {
namespace fs = std::filesystem;

FlashDir FlashDir::create(const std::string& base, const std::string& run_id,
                          int64_t limit_bytes, pid_t guard_pid) {
  DL_CHECK(limit_bytes > 0) << limit_bytes;
  std::string name = "dlaunch_flash_";
  for (char c : run_id) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    name += ok ? c : '_';
  }
  std::string templ = fmt::format("{}/{}_XXXXXX", base, name);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    throw SystemError(fmt::format(
        "cannot create the job's flash directory {}: {}; expected a writable memory file system "
        "at {} (pass --flash_limit 0 to run without a flash directory)",
        templ, std::strerror(errno), base));
  }
  FlashDir d;
  d.path_ = buf.data();
  d.limit_ = limit_bytes;
  // The owner record goes in twice: under the mount point and inside the tmpfs. A sweeper in
  // another mount namespace (`ip netns exec` makes one per command) sees only the directory
  // beneath; one in ours sees only the tmpfs.
  if (guard_pid > 0) write_flash_owner(d.path_, ::getpid(), guard_pid, run_id);
  // A tmpfs of its own is what makes the limit real. MS_NOSUID|MS_NODEV: it holds data only.
  std::string opts = fmt::format("size={},mode=0700", limit_bytes);
  if (::mount("dlaunch_flash", d.path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) == 0) {
    d.mounted_ = true;
    if (guard_pid > 0) write_flash_owner(d.path_, ::getpid(), guard_pid, run_id);
  } else {
    log_debug("flash directory {}: no tmpfs of its own ({}); the limit is not enforced", d.path_,
              std::strerror(errno));
  }
  return d;
}

FlashDir::~FlashDir() { remove(); }

FlashDir::FlashDir(FlashDir&& other) noexcept
    : path_(std::exchange(other.path_, std::string())),
      mounted_(std::exchange(other.mounted_, false)),
      limit_(other.limit_) {}

FlashDir& FlashDir::operator=(FlashDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::exchange(other.path_, std::string());
    mounted_ = std::exchange(other.mounted_, false);
    limit_ = other.limit_;
  }
  return *this;
}

void FlashDir::remove() {
  if (path_.empty()) return;
  if (mounted_ && ::umount2(path_.c_str(), MNT_DETACH) != 0) {
    log_warning("cannot unmount the flash directory {}: {}", path_, std::strerror(errno));
  }
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) log_warning("cannot remove the flash directory {}: {}", path_, ec.message());
  path_.clear();
  mounted_ = false;
}

int64_t host_ram_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t parse_flash_limit(const std::string& text, const std::string& what, int64_t ram_bytes) {
  auto bad = [&] {
    return UsageError(fmt::format(
        "{}='{}' is not a size; expected 0 (no flash directory), bytes with an optional K, M, G "
        "or T suffix (512M), or a percentage of this host's memory (25%)",
        what, text));
  };
  if (text.empty()) throw bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  if (!std::isfinite(v) || v < 0) throw bad();
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && suffix.back() == 'B' && suffix != "B") suffix.pop_back();  // "512MB"
  double bytes;
  if (suffix == "%") {
    if (v > 100) {
      throw UsageError(fmt::format(
          "{}='{}' is more than this host's memory; expected a percentage from 0 to 100%", what,
          text));
    }
    bytes = v / 100 * static_cast<double>(ram_bytes);
  } else {
    const std::string units = "KMGT";
    double mult = 1;
    if (!suffix.empty() && suffix != "B") {
      size_t k = units.find(suffix);
      if (suffix.size() != 1 || k == std::string::npos) throw bad();
      mult = std::pow(1024.0, static_cast<double>(k + 1));
    }
    bytes = v * mult;
  }
  if (bytes > 9e18) throw bad();
  return static_cast<int64_t>(bytes);
}

}  // namespace dlaunch
