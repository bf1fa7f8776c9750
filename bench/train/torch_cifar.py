#!/usr/bin/python3
"""PyTorch twin (Debian's 1.13 or the 2.x venv) of dtrain's CIFAR-10 accuracy recipe, for
docs/benchmarks.md.

Same data files (CIFAR-10 binary: data_batch_*.bin for training, test_batch.bin for test), same
network (torch_resnet.py), same normalisation and augmentation (random crop with 4 zero pixels of
padding, horizontal flip), SGD with Nesterov momentum, weight decay, linear warm-up then cosine
evaluated per step (dtrain's lr_at). Runs alone or under torchrun/dlaunch (DDP over gloo).

  /usr/bin/python3 bench/train/torch_cifar.py --data_dir ../shared/data/cifar-10-batches-bin \
      --width 16 --epochs 20 --batch_size 128 --lr 0.1 --warmup_epochs 1 --threads 2
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_resnet import ResNet  # noqa: E402

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def load_cifar(files):
    raw = np.concatenate([np.fromfile(f, dtype=np.uint8).reshape(-1, 3073) for f in files])
    labels = raw[:, 0].astype(np.int64)
    images = raw[:, 1:].reshape(-1, 3, 32, 32)
    return images, labels


def normalise(u8):
    x = u8.astype(np.float32) / 255.0
    return (x - MEAN[None, :, None, None]) / STD[None, :, None, None]


def augment(u8, rng):
    n = u8.shape[0]
    padded = np.zeros((n, 3, 40, 40), dtype=np.uint8)
    padded[:, :, 4:36, 4:36] = u8
    out = np.empty_like(u8)
    dy = rng.integers(0, 9, n)
    dx = rng.integers(0, 9, n)
    flip = rng.integers(0, 2, n).astype(bool)
    for i in range(n):
        crop = padded[i, :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
        out[i] = crop[:, :, ::-1] if flip[i] else crop
    return out


def lr_at(base, warmup, total, epochs):
    if epochs < warmup:
        return base * epochs / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (epochs - warmup) / (total - warmup)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data_dir", required=True)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=18)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--warmup_epochs", type=float, default=1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--output", default="")
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed * 1000 + rank)

    train_files = sorted(glob.glob(os.path.join(args.data_dir, "data_batch_*.bin")))
    x_train, y_train = load_cifar(train_files)
    x_test, y_test = load_cifar([os.path.join(args.data_dir, "test_batch.bin")])
    model = ResNet(args.depth, args.width)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True,
                          weight_decay=args.weight_decay)
    n = len(y_train)
    per_rank = math.ceil(n / world)
    steps = math.ceil(per_rank / args.batch_size)
    results = []
    for epoch in range(args.epochs):
        g = torch.Generator()
        g.manual_seed(args.seed + epoch)
        perm = torch.randperm(n, generator=g).numpy()
        perm = np.concatenate([perm, perm[: per_rank * world - n]])[rank::world]
        model.train()
        t0 = time.time()
        tot_loss = tot_correct = seen = 0
        for i in range(steps):
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            x = torch.from_numpy(normalise(augment(x_train[idx], rng)))
            y = torch.from_numpy(y_train[idx])
            for group in opt.param_groups:
                group["lr"] = lr_at(args.lr, args.warmup_epochs, args.epochs, epoch + i / steps)
            out = model(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tot_loss += loss.item() * len(y)
            tot_correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
        train_time = time.time() - t0
        model.eval()
        correct = loss_sum = 0
        with torch.no_grad():
            mine = np.arange(rank, len(y_test), world)
            for s in range(0, len(mine), 500):
                idx = mine[s:s + 500]
                out = model(torch.from_numpy(normalise(x_test[idx])))
                y = torch.from_numpy(y_test[idx])
                loss_sum += F.cross_entropy(out, y, reduction="sum").item()
                correct += (out.argmax(1) == y).sum().item()
        stats = torch.tensor([tot_loss, tot_correct, seen, loss_sum, correct, len(mine)], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(stats)
        rec = {"epoch": epoch + 1, "loss": stats[0].item() / stats[2].item(),
               "train_accuracy": stats[1].item() / stats[2].item(),
               "test_loss": stats[3].item() / stats[5].item(),
               "test_accuracy": stats[4].item() / stats[5].item(),
               "images_per_s": stats[2].item() / train_time, "epoch_time_s": time.time() - t0,
               "torch": torch.__version__}
        results.append(rec)
        if rank == 0:
            print(json.dumps(rec), flush=True)
    if rank == 0 and args.output:
        with open(args.output, "w") as f:
            json.dump(results, f)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
