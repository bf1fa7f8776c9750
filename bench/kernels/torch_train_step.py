#!/usr/bin/python3
"""PyTorch's side of bench_train_step: images/s of one training step (forward, cross-entropy,
backward, SGD nesterov momentum 0.9 + weight decay 5e-4) of a CIFAR ResNet-18 on random data.

Usage: torch_train_step.py --width 64 --batch 128 --threads 2 --steps 5 --warmup 2
Prints one line: "torch images_per_s <median> step_s <median seconds> cpu_images_per_s <batch *
threads / median process CPU seconds per step> cpu_s <...> steps ..." (per-step seconds).
The model is written out here (no torchvision): CIFAR stem (3x3 conv stride 1, no max-pool),
BasicBlocks [2, 2, 2, 2], widths w, 2w, 4w, 8w.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                            nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, width, in_channels=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, c_in = [], width
        for i in range(4):
            c_out = width << i
            layers.append(nn.Sequential(BasicBlock(c_in, c_out, 1 if i == 0 else 2),
                                        BasicBlock(c_out, c_out, 1)))
            c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


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
    model = ResNet18(a.width).train()
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
