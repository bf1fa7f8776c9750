#include "launcher/config/run_dir.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "launcher/config/cli.h"

namespace dlaunch {
namespace fs = std::filesystem;

namespace {

// mkdtemp: <prefix>XXXXXX with a random suffix, created atomically (mode 0700, as torchrun's).
std::string make_unique_dir(const std::string& prefix) {
  std::string templ = prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    throw UsageError(
        fmt::format("cannot create a run directory {}: {}; give a writable "
                    "--log_dir",
                    templ, std::strerror(errno)));
  }
  return buf.data();
}

}  // namespace

RunDir create_run_dir(const std::string& log_dir, const std::string& run_id, bool named_by_user) {
  // Absolute, so the paths handed to workers (error file, heartbeat) survive a chdir.
  fs::path base = fs::absolute(fs::path(log_dir)).lexically_normal();
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) {
    throw UsageError(
        fmt::format("cannot create the log directory {}: {}; give a writable "
                    "--log_dir",
                    base.string(), ec.message()));
  }
  std::string prefix = (base / (run_id + "_")).string();
  RunDir out;
  if (!named_by_user) {
    out.path = make_unique_dir(prefix);
    return out;
  }
  std::string named = (base / run_id).string();
  if (::mkdir(named.c_str(), 0777) == 0) {
    out.path = named;
    return out;
  }
  int err = errno;
  if (err != EEXIST) {
    throw UsageError(
        fmt::format("cannot create the run directory {}: {}; give a writable "
                    "--log_dir",
                    named, std::strerror(err)));
  }
  out.path = make_unique_dir(prefix);
  out.note = fmt::format(
      "{} already exists (an earlier run with --rdzv_id {}, or another node of this job sharing "
      "--log_dir); it is left as it is and this run writes to {}",
      named, run_id, out.path);
  return out;
}

bool run_id_named_by_user(const LaunchConfig& cfg) {
  auto it = cfg.origin.find("rdzv_id");
  if (it == cfg.origin.end()) return false;
  const std::string& o = it->second;
  // Origins are the flag as spelled ("--rdzv_id", "--rdzv-id", a unique prefix), the twin's
  // name, "default", "--standalone (random)" or a scheduler's variable (SLURM_JOB_ID).
  return o.rfind("--rdzv", 0) == 0 || o == flag_spec("rdzv_id").env || o == "PET_RDZV_ID";
}

}  // namespace dlaunch
