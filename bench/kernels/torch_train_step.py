#!/usr/bin/python3
"""PyTorch's side of bench_train_step: images/s of one training step (forward, cross-entropy,
backward, SGD nesterov momentum 0.9 + weight decay 5e-4) of a CIFAR ResNet-18 on random data.

Usage: torch_train_step.py --width 64 --batch 128 --threads 2 --steps 5 --warmup 2
Prints one line: "torch images_per_s <median> step_s <median seconds> cpu_images_per_s <batch *
threads / median process CPU seconds per step> cpu_s <...> steps ..." (per-step seconds).
The model is bench/train/torch_resnet.py's ResNet-18 (no torchvision here): the same network
as dtrain's.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from torch_resnet import ResNet  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = ResNet(18, a.width).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    images = torch.randn(a.batch, 3, 32, 32)
    labels = torch.randint(0, 10, (a.batch,))
    times, cpu = [], []
    for s in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if s >= a.warmup:
            times.append(dt)
            cpu.append(dc)
    med, cmed = statistics.median(times), statistics.median(cpu)
    # cpu_images_per_s: images per CPU-second of the process times the thread count, i.e. the
    # rate the step would reach with all its threads on otherwise idle cores.
    print("torch images_per_s %.2f step_s %.4f cpu_images_per_s %.2f cpu_s %.4f steps %s" % (
          a.batch / med, med, a.batch * a.threads / cmed, cmed,
          " ".join("%.4f" % t for t in times)), flush=True)


if __name__ == "__main__":
    main()
