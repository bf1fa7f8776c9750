// Time to load and decode an ImageFolder dataset (a directory or a tar archive) into memory,
// as dtrain does at start: bench_image_load PATH [threads] [runs]. Prints one line per run and
// the median; the pixel sum shows every run decoded the same bytes.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

int main(int argc, char** argv) {
  using namespace dlaunch::data;
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_image_load PATH [threads, 0 = cores] [runs]\n");
    return 2;
  }
  ImageFolderOptions options;
  options.threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  std::vector<double> secs;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    DatasetSplits s = load_image_folder(argv[1], options);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    secs.push_back(dt);
    const uint64_t sum =
        std::accumulate(s.train.pixels.begin(), s.train.pixels.end(), uint64_t{0}) +
        std::accumulate(s.test.pixels.begin(), s.test.pixels.end(), uint64_t{0});
    fmt::print("dtrain run {}: {} + {} images {}x{} in {:.3f} s (pixel sum {})\n", r + 1,
               s.train.size(), s.test.size(), s.train.width, s.train.height, dt, sum);
  }
  std::sort(secs.begin(), secs.end());
  fmt::print("dtrain median {:.3f} s over {} runs, threads {}\n", secs[secs.size() / 2], runs,
             options.threads);
  return 0;
}
