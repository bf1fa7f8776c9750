#!/usr/bin/env python3
"""PyTorch 2.x's side of bench/gpu (issue 11): the ResNet-18 of bench/train/torch_resnet.py (dtrain's
network) trained with the data held on the device (torch_gpu_data.py), in the modes users run:
eager fp32, eager with autocast bf16/fp16 and channels_last, and torch.compile on top.

  throughput: images/s of full training steps (augmented batch from the resident data, forward,
              loss, backward, SGD) after warm-up, the peak memory PyTorch's allocator held, and
              one JSON line.
  train:      dtrain's --recipe cifar-fast written in PyTorch (docs/dtrain.md "Recipes"): Nesterov
              SGD with a triangle schedule from 0 peaking at 20% of the run, no weight decay on BN
              parameters and biases, label smoothing, cutout, alternating flip, an average of the
              weights and BN statistics every K steps with warm-up, flip test-time augmentation;
              one JSON line with the test accuracy and the seconds from the first step to the end
              of the final evaluation (what bench/gpu/gpu_bench.py compares with dtrain's).

  python3 bench/gpu/torch_cifar_gpu.py throughput --device cuda --precision bf16 --channels_last --batch_size 512
  python3 bench/gpu/torch_cifar_gpu.py train --data cifar-10-jpeg.tar.gz --device cuda --seed 0

Runs on the CPU too (tests/gpu_bench_selftest.sh), where torch.compile may be missing (PyTorch
1.13): --compile then prints {"unavailable": ...} and exits 3.
"""
import argparse
import json
import os
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "train"))
from torch_amp_step import AMP, make_step as make_amp_step  # noqa: E402
from torch_gpu_data import Augment, load_cifar, normalise  # noqa: E402
from torch_resnet import ResNet  # noqa: E402

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args, device):
    torch.manual_seed(args.seed)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = ResNet(18, args.width).to(device, memory_format=fmt)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_bn_or_bias = p.ndim == 1  # BN weights and biases, the classifier's bias
        (no_decay if (is_bn_or_bias and args.no_bn_weight_decay) else decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov)
    step_model = model
    if args.compile:
        if not hasattr(torch, "compile"):
            print(json.dumps({"unavailable": f"torch.compile needs PyTorch 2.x; this is {torch.__version__}"}))
            sys.exit(3)
        step_model = torch.compile(model)
    return model, step_model, opt


def make_step(args, device, step_model, opt):
    return make_amp_step(step_model, opt, device.type, args.precision, args.label_smoothing)


def throughput(args, device):
    train_x, train_y, _, _ = load_cifar(args.data, device, train_limit=args.train_limit, seed=args.seed)
    model, step_model, opt = build(args, device)
    step = make_step(args, device, step_model, opt)
    aug = Augment(train_x.shape[0], device, args.seed, cutout=args.cutout)
    model.train()
    n, b = train_x.shape[0], args.batch_size
    epoch, pos, images = 0, n, None
    order = None

    def next_batch():
        nonlocal epoch, pos, images, order
        if pos + b > n:
            images = aug.epoch(train_x, epoch, channels_last=args.channels_last)
            order = torch.randperm(n, device=device)
            epoch, pos = epoch + 1, 0
        idx = order[pos:pos + b]
        pos += b
        return images[idx], train_y[idx]

    for _ in range(args.warmup):
        step(*next_batch())
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(*next_batch())
    sync(device)
    secs = time.perf_counter() - t0
    out = {"images_per_s": b * args.steps / secs, "batch_size": b, "steps": args.steps,
           "precision": args.precision, "channels_last": args.channels_last, "compile": args.compile,
           "width": args.width, "device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    print(json.dumps(out), flush=True)


def triangle(step, total, peak_at):
    """dtrain's --lr_schedule triangle: 0 -> 1 over the first `peak_at` steps, then down to 0."""
    if step < peak_at:
        return step / peak_at
    return max(0.0, (total - step) / max(1, total - peak_at))


class WeightAverage:
    """dtrain's --ema DECAY --ema_every K --ema_warmup (worker/optim/weight_ema.cc): every K optimizer
    steps avg = d^K avg + (1 - d^K) w with d = min(DECAY, (1 + t) / (10 + t)), over the parameters
    and the BN running statistics."""

    def __init__(self, model, decay, every):
        self.model, self.decay, self.every = model, decay, every
        self.avg = {k: v.detach().clone() for k, v in model.state_dict().items() if v.dtype.is_floating_point}

    @torch.no_grad()
    def after_step(self, t):
        if t % self.every:
            return
        d = min(self.decay, (1 + t) / (10 + t)) ** self.every
        live = self.model.state_dict()
        for k, a in self.avg.items():
            a.mul_(d).add_(live[k].detach(), alpha=1 - d)

    def swap(self):
        live = self.model.state_dict()
        for k, a in self.avg.items():
            tmp = live[k].detach().clone()
            live[k].copy_(a)
            a.copy_(tmp)


@torch.no_grad()
def evaluate(args, model, test_x, test_y):
    model.eval()
    amp = AMP[args.precision]
    correct = 0
    for i in range(0, test_x.shape[0], 1000):
        x = normalise(test_x[i:i + 1000], channels_last=args.channels_last)
        with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
            logits = model(x).float()
            if args.tta == "flip":
                logits = 0.5 * (logits + model(x.flip(3)).float())
        correct += (logits.argmax(1) == test_y[i:i + 1000]).sum().item()
    model.train()
    return correct / test_x.shape[0]


def train(args, device):
    train_x, train_y, test_x, test_y = load_cifar(args.data, device, args.train_limit, args.test_limit, args.seed)
    model, step_model, opt = build(args, device)
    step = make_step(args, device, step_model, opt)
    aug = Augment(train_x.shape[0], device, args.seed, cutout=args.cutout, alternating_flip=True)
    ema = WeightAverage(model, args.ema, args.ema_every) if args.ema else None
    n, b = train_x.shape[0], args.batch_size
    per_epoch = n // b  # dtrain drops the last partial batch of an epoch
    total = per_epoch * args.epochs
    peak_at = round(total * args.warmup_fraction)
    g = torch.Generator(device=device).manual_seed(args.seed)
    model.train()
    sync(device)
    t0 = time.perf_counter()
    t = 0
    for epoch in range(args.epochs):
        images = aug.epoch(train_x, epoch, channels_last=args.channels_last)
        order = torch.randperm(n, device=device, generator=g)
        for s in range(per_epoch):
            for group in opt.param_groups:
                group["lr"] = args.lr * triangle(t, total, peak_at)
            idx = order[s * b:(s + 1) * b]
            step(images[idx], train_y[idx])
            t += 1
            if ema:
                ema.after_step(t)
    if ema:
        ema.swap()
    accuracy = evaluate(args, model, test_x, test_y)
    sync(device)
    secs = time.perf_counter() - t0
    print(json.dumps({"test_accuracy": accuracy, "seconds": secs, "epochs": args.epochs, "seed": args.seed,
                      "steps": t, "batch_size": b, "precision": args.precision, "device": str(device),
                      "torch": torch.__version__}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["throughput", "train"])
    p.add_argument("--data", default="synthetic", help="the JPEG archive, a cifar-10-batches-bin dir, or synthetic")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16", choices=sorted(AMP))
    p.add_argument("--channels_last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=500)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_limit", type=int, default=0)
    p.add_argument("--test_limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    # --recipe cifar-fast's values (docs/dtrain.md)
    p.add_argument("--epochs", type=int, default=26)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", type=bool, default=True)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--no_bn_weight_decay", type=bool, default=True)
    p.add_argument("--warmup_fraction", type=float, default=0.2)
    p.add_argument("--label_smoothing", type=float, default=0.2)
    p.add_argument("--cutout", type=int, default=12)
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--ema_every", type=int, default=5)
    p.add_argument("--tta", default="flip", choices=["flip", "none"])
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.set_device(device)
    (throughput if args.what == "throughput" else train)(args, device)


if __name__ == "__main__":
    main()
