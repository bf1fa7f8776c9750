#include "worker/train/worker_runtime.h"

#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace dlaunch::train {

bool write_error_file(const std::string& path, const std::string& type, const std::string& what) {
  if (path.empty()) return true;
  nlohmann::json record = {
      {"message",
       {{"message", type + ": " + what},
        {"extraInfo",
         {{"py_callstack", "dtrain (C++): " + type + ": " + what},
          {"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
  std::ofstream out(path, std::ios::trunc);
  out << record.dump() << "\n";
  out.close();
  if (!out) {
    log_error("could not write the error file {}", path);
    return false;
  }
  return true;
}

int resolve_threads(int flag, const WorkerEnv& env) {
  if (flag > 0) return flag;
  try {
    if (auto omp = get_env_int(env_names::kOmpNumThreads); omp && *omp > 0) {
      return static_cast<int>(*omp);
    }
  } catch (const Error& e) {
    log_warning("ignoring OMP_NUM_THREADS: {}", e.what());
  }
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  int local = static_cast<int>(std::max<int64_t>(1, env.local_world_size));
  return std::max(1, cores / local);
}

}  // namespace dlaunch::train
