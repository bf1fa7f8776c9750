// Training-step throughput of dtrain's CIFAR ResNet-18 (forward, cross-entropy, backward,
// SGD nesterov momentum 0.9 + weight decay 5e-4) on random data, beside PyTorch 1.13's figure
// for the same model, batch and thread count from the same run (torch_train_step.py through
// /usr/bin/python3), and the ratio.
//
//   bench_train_step [--widths 64,16] [--batch 128] [--threads 2] [--steps 5] [--warmup 2]
//                    [--repeat 1] [--no-torch] [--profile] [--depth 18]
//
// Reports medians of per-step times. With --repeat R, ours and PyTorch's runs alternate R times
// (so slow drifts in the machine's load hit both) and the summary shows the median over rounds
// of images/s and of the per-round ratio. --profile prints where our step spends its time.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "kernels/ops.h"
#include "kernels/profile.h"
#include "worker/model/loss.h"
#include "worker/model/resnet.h"
#include "worker/optim/optimizer.h"

#ifndef DLAUNCH_TORCH_BENCH
#define DLAUNCH_TORCH_BENCH "bench/kernels/torch_train_step.py"
#endif

namespace {

using namespace dlaunch;
using namespace dlaunch::model;
using namespace dlaunch::optim;

struct Options {
  std::vector<int> widths = {64, 16};
  int depth = 18;
  int batch = 128;
  int threads = 2;
  int steps = 5;
  int warmup = 2;
  int repeat = 1;
  bool torch = true;
  bool profile = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Median seconds per training step; *cpu_out gets the median process CPU seconds per step.
double run_ours(const Options& o, int width, std::vector<double>* steps_out, double* cpu_out) {
  kernels::cpu::set_num_threads(o.threads);
  ResNet net(ResNetConfig{o.depth, width, 3, 10, 32}, 0);
  OptimConfig oc;
  oc.momentum = 0.9;
  oc.nesterov = true;
  oc.weight_decay = 5e-4;
  Optimizer opt(oc);
  Tensor images({o.batch, 3, 32, 32});
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = normal(rng);
  std::vector<int32_t> labels(static_cast<size_t>(o.batch));
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
  Tensor grad;
  std::vector<double> times, cpu;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (o.profile && s == o.warmup) {
      kernels::profile_report(true);
      kernels::set_profiling(true);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    const Tensor& logits = net.forward(images, true);
    softmax_cross_entropy(logits, labels.data(), &grad, nullptr);
    net.backward(grad);
    opt.step(net.params(), net.grads(), net.num_params(), 0.1f, net.param_info());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double dc = process_cpu_seconds() - c0;
    if (s >= o.warmup) {
      times.push_back(dt);
      cpu.push_back(dc);
    }
  }
  if (o.profile) {
    kernels::set_profiling(false);
    std::printf("profile, width %d, %d steps:\n%s", width, o.steps, kernels::profile_report(true).c_str());
  }
  *steps_out = times;
  *cpu_out = median(cpu);
  return median(times);
}

// PyTorch's images/s, or a negative number when it could not be measured; *cpu_ips gets its
// CPU-time-based rate (see torch_train_step.py).
double run_torch(const Options& o, int width, double* cpu_ips) {
  const std::string cmd = "/usr/bin/python3 " DLAUNCH_TORCH_BENCH " --width " + std::to_string(width) +
                          " --batch " + std::to_string(o.batch) + " --threads " +
                          std::to_string(o.threads) + " --steps " + std::to_string(o.steps) +
                          " --warmup " + std::to_string(o.warmup);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char line[4096];
  double ips = -1;
  while (std::fgets(line, sizeof line, p)) {
    std::fputs(line, stdout);
    std::sscanf(line, "torch images_per_s %lf step_s %*f cpu_images_per_s %lf", &ips, cpu_ips);
  }
  if (pclose(p) != 0) return -1;
  return ips;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(static_cast<int>(parse_int(item, "--widths")));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--widths") o.widths = parse_list(next());
    else if (a == "--depth") o.depth = static_cast<int>(parse_int(next(), a));
    else if (a == "--batch") o.batch = static_cast<int>(parse_int(next(), a));
    else if (a == "--threads") o.threads = static_cast<int>(parse_int(next(), a));
    else if (a == "--steps") o.steps = static_cast<int>(parse_int(next(), a));
    else if (a == "--warmup") o.warmup = static_cast<int>(parse_int(next(), a));
    else if (a == "--repeat") o.repeat = static_cast<int>(parse_int(next(), a));
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--profile") o.profile = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_train_step [--widths 64,16] [--depth 18] [--batch 128] [--threads 2]"
                   " [--steps 5] [--warmup 2] [--repeat 1] [--no-torch] [--profile]\n");
      return 2;
    }
  }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) > 0) std::printf("load average before: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  std::printf("ResNet-%d CIFAR, batch %d, %d threads, median of %d steps after %d warm-up\n", o.depth,
              o.batch, o.threads, o.steps, o.warmup);
  // Two figures per side: wall-clock images/s (what a user sees; hurt by whatever else runs on
  // the machine) and CPU images/s = batch * threads / process CPU seconds per step (the rate with
  // the threads on otherwise idle cores; robust to load from other processes).
  struct Row {
    int width;
    double ours, torch, ratio, ours_cpu, torch_cpu, cpu_ratio;
  };
  std::vector<Row> rows;
  for (int w : o.widths) {
    std::vector<double> ours_ips, torch_ips, ratios, ours_cpu, torch_cpu, cpu_ratios;
    for (int round = 0; round < o.repeat; ++round) {
      std::vector<double> steps;
      double cpu_s = 0;
      const double t = run_ours(o, w, &steps, &cpu_s);
      const double cpu_ips = o.batch * o.threads / cpu_s;
      std::printf("dtrain width %d images_per_s %.2f step_s %.4f cpu_images_per_s %.2f cpu_s %.4f steps",
                  w, o.batch / t, t, cpu_ips, cpu_s);
      for (double s : steps) std::printf(" %.4f", s);
      std::printf("\n");
      std::fflush(stdout);
      ours_ips.push_back(o.batch / t);
      ours_cpu.push_back(cpu_ips);
      double torch_cpu_ips = -1;
      const double torch = (o.torch && o.depth == 18) ? run_torch(o, w, &torch_cpu_ips) : -1;
      if (torch > 0) {
        torch_ips.push_back(torch);
        ratios.push_back(o.batch / t / torch);
      }
      if (torch_cpu_ips > 0) {
        torch_cpu.push_back(torch_cpu_ips);
        cpu_ratios.push_back(cpu_ips / torch_cpu_ips);
      }
    }
    auto med = [](const std::vector<double>& v) { return v.empty() ? -1.0 : median(v); };
    rows.push_back({w, med(ours_ips), med(torch_ips), med(ratios), med(ours_cpu), med(torch_cpu),
                    med(cpu_ratios)});
  }
  std::printf("\nmedians over %d round%s\n%-6s %12s %12s %7s   %14s %14s %7s\n", o.repeat,
              o.repeat == 1 ? "" : "s", "width", "dtrain img/s", "torch img/s", "ratio",
              "dtrain CPU i/s", "torch CPU i/s", "ratio");
  for (const Row& r : rows) {
    if (r.torch > 0)
      std::printf("%-6d %12.1f %12.1f %6.2fx   %14.1f %14.1f %6.2fx\n", r.width, r.ours, r.torch,
                  r.ratio, r.ours_cpu, r.torch_cpu, r.cpu_ratio);
    else
      std::printf("%-6d %12.1f %12s %7s   %14.1f %14s %7s\n", r.width, r.ours, "n/a", "n/a",
                  r.ours_cpu, "n/a", "n/a");
  }
  if (getloadavg(load, 3) > 0) std::printf("load average after: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  return 0;
}
