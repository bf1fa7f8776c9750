#!/usr/bin/python3
"""A plain PyTorch DistributedDataParallel script, unchanged from what one would run under
torchrun, to show that dlaunch runs it as is (gloo on CPU, nccl when every rank has a GPU).

  dlaunch --standalone --nproc_per_node=2 /usr/bin/python3 examples/pytorch/ddp_train.py
  torchrun --standalone --nproc_per_node=2 -r 1 -t 1 examples/pytorch/ddp_train.py

(torchrun 1.13 on Python 3.11 crashes parsing its -r/-t defaults, and "-r 0 -t 0" too: Python
3.11 no longer lists the zero-valued Std.NONE flag when iterating the enum; "-r 1 -t 1" works.)

It reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) through
init_process_group's env:// default, trains a small MLP on a seeded synthetic classification
task with a DistributedSampler, all-reduces the evaluation, and has rank 0 print one line per
epoch. With --checkpoint it saves every epoch and resumes after a restart (dlaunch
--max_restarts), like torchrun's elastic examples. Exits non-zero if the final accuracy is not
well above chance, so it doubles as a smoke test.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 32, generator=torch.Generator().manual_seed(1234)) * 2
    labels = torch.randint(0, 10, (n,), generator=g)
    x = centres[labels] + torch.randn(n, 32, generator=g) * 1.5
    return TensorDataset(x, labels)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint", default="")
    args = p.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    train, test = make_data(5000, 1), make_data(1000, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"]
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {start}", flush=True)

    acc = 0.0
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        ddp.eval()
        with torch.no_grad():
            x, y = test.tensors[0][rank::world].to(device), test.tensors[1][rank::world].to(device)
            out = ddp(x)
            stats = torch.tensor([F.cross_entropy(out, y, reduction="sum").item(),
                                  (out.argmax(1) == y).sum().item(), len(y)],
                                 dtype=torch.float64, device=device)
        dist.all_reduce(stats)
        acc = (stats[1] / stats[2]).item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} world {world} test loss "
                  f"{(stats[0] / stats[2]).item():.4f} acc {100 * acc:.2f}%", flush=True)
            if args.checkpoint:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1}, tmp)
                os.replace(tmp, args.checkpoint)
        dist.barrier()
    dist.destroy_process_group()
    if start < args.epochs and acc < 0.5:
        raise SystemExit(f"final accuracy {acc:.3f} is not well above chance (0.1)")


if __name__ == "__main__":
    main()
