// Thread control for the CPU ops. oneDNN (Debian's build uses the GNU OpenMP runtime, the same
// libgomp we link) runs on the OpenMP team of the calling thread, so omp_set_num_threads governs
// it and our own loops alike; OpenBLAS (pthread build) has its own pool, set separately.
#include <omp.h>

#include "common/error.h"
#include "kernels/ops.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace dlaunch::kernels::cpu {

void set_num_threads(int n) {
  DL_CHECK(n >= 1) << "threads=" << n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

int preferred_cblock(int64_t c) {
  // oneDNN's AVX-512 kernels work on 16-channel blocks, its AVX2 kernels on 8.
  static const int kBlock = __builtin_cpu_supports("avx512f") ? 16 : 8;
  if (c % kBlock == 0) return kBlock;
  if (c % 8 == 0) return 8;
  return 1;
}

}  // namespace dlaunch::kernels::cpu
