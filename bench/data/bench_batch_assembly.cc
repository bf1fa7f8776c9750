// How fast the CPU loader turns stored uint8 CIFAR images into augmented float batches
// (data::make_batch: pad-4 crop, flip, normalisation, optionally cutout and alternating flip),
// single-threaded as the BatchLoader's producer runs it, beside torchvision's per-sample
// transforms (RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize, what a
// PyTorch CIFAR DataLoader worker runs) from torch_batch_assembly.py in the same run.
//
//   bench_batch_assembly [--batch 512] [--batches 40] [--runs 5] [--no-torch]
//
// Prints a line per run and recipe, then the medians in images/s and our ratio to torchvision.
// The data is CIFAR-10's data_batch_1.bin from DLAUNCH_DATA_DIR when present, else the synthetic
// set (same shape); the checksum shows every run produced the same floats.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "worker/data/batch_loader.h"
#include "worker/data/dataset.h"

#ifndef DLAUNCH_DATA_DIR
#define DLAUNCH_DATA_DIR "../shared/data"
#endif
#ifndef DLAUNCH_TORCH_BATCH_BENCH
#define DLAUNCH_TORCH_BATCH_BENCH "bench/data/torch_batch_assembly.py"
#endif

namespace {

using namespace dlaunch::data;

struct Options {
  int64_t batch = 512;
  int64_t batches = 40;
  int runs = 5;
  bool torch = true;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        fmt::print(stderr, "bench_batch_assembly: {} needs a value\n", a);
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--batch")
      o.batch = value();
    else if (a == "--batches")
      o.batches = value();
    else if (a == "--runs")
      o.runs = static_cast<int>(value());
    else if (a == "--no-torch")
      o.torch = false;
    else {
      fmt::print(stderr,
                 "bench_batch_assembly: unknown argument '{}'; expected --batch N, "
                 "--batches N, --runs N or --no-torch\n",
                 a);
      std::exit(2);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// images/s of `batches` batches of make_batch, and a checksum of the floats.
double run_make_batch(const ImageDataset& ds, const Options& o, const AugmentRecipe& recipe,
                      double* checksum) {
  std::vector<int64_t> indices(static_cast<size_t>(o.batch));
  double sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < o.batches; ++b) {
    for (int64_t i = 0; i < o.batch; ++i) indices[i] = (b * o.batch + i * 7919) % ds.size();
    const Batch batch = make_batch(ds, indices, /*augment=*/true, /*seed=*/1, /*epoch=*/b, recipe);
    sum += batch.images[static_cast<size_t>(b) % batch.images.size()];
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *checksum = sum;
  return static_cast<double>(o.batch * o.batches) / secs;
}

// torchvision's figure (images/s) from the Python peer, or 0 when it did not run.
double run_torch(const std::string& cifar_dir, const Options& o) {
  const std::string cmd = fmt::format("/usr/bin/python3 {} --data '{}' --images {} 2>&1",
                                      DLAUNCH_TORCH_BATCH_BENCH, cifar_dir, o.batch * o.batches);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[512];
  double ips = 0;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (std::sscanf(line, "torchvision images/s %lf", &ips) != 1) fmt::print("  torch: {}", line);
  }
  pclose(p);
  return ips;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string cifar_dir = std::string(DLAUNCH_DATA_DIR) + "/cifar-10-batches-bin";
  const bool real = std::filesystem::exists(cifar_dir + "/data_batch_1.bin");
  const ImageDataset ds = real ? load_cifar10(cifar_dir, true) : make_synthetic(1, true);
  fmt::print("data: {} ({} images), batch {}, {} batches per run, 1 thread\n", ds.name, ds.size(),
             o.batch, o.batches);
  const std::vector<std::pair<std::string, AugmentRecipe>> recipes = {
      {"crop+flip", {}}, {"crop+flip+cutout12+altflip", {12, true}}};
  std::vector<std::vector<double>> ours(recipes.size());
  std::vector<double> torch;
  for (int r = 0; r < o.runs; ++r) {
    for (size_t k = 0; k < recipes.size(); ++k) {
      double checksum = 0;
      const double ips = run_make_batch(ds, o, recipes[k].second, &checksum);
      ours[k].push_back(ips);
      fmt::print("run {} dtrain {:<28} {:>9.0f} images/s (checksum {:.6f})\n", r + 1,
                 recipes[k].first, ips, checksum);
    }
    // Alternating with ours, so a change in the machine's load hits both.
    if (o.torch && real) {
      const double ips = run_torch(cifar_dir, o);
      if (ips > 0) {
        torch.push_back(ips);
        fmt::print("run {} torchvision crop+flip          {:>9.0f} images/s\n", r + 1, ips);
      }
    }
  }
  for (size_t k = 0; k < recipes.size(); ++k)
    fmt::print("median dtrain {:<28} {:>9.0f} images/s\n", recipes[k].first, median(ours[k]));
  if (!torch.empty()) {
    fmt::print(
        "median torchvision crop+flip          {:>9.0f} images/s  (dtrain/torchvision {:.1f}x)\n",
        median(torch), median(ours[0]) / median(torch));
  } else {
    fmt::print("torchvision: not run ({})\n", !o.torch ? "--no-torch"
                                              : real   ? "it failed"
                                                       : "no CIFAR-10 data");
  }
  return 0;
}
