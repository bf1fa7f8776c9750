#!/usr/bin/python3
"""The peer of bench/train/flash_bench.py's recovery figure: how a PyTorch job with the usual
per-epoch checkpoints comes back under torchrun after a worker is SIGKILLed. The same ResNet as
dtrain (torch_resnet.py), DDP over gloo, a fixed synthetic data set of --samples images sharded
by DistributedSampler, SGD; rank 0 saves a checkpoint after every epoch (save to a temporary
name, then rename) and every worker resumes from it at start. Rank 0 appends one JSON line per
step to --metrics ({"step": global step, "t": time.time()}), flushed at once.

  /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --max_restarts 1 \\
      -r 1 -t 1 bench/train/torch_epoch_ckpt.py --out /tmp/ck --metrics /tmp/ck/m.jsonl
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_resnet import ResNet  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--metrics", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(ResNet(18, args.width))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 3, 32, 32, generator=g),
                         torch.randint(0, 10, (args.samples,), generator=g))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    ckpt = os.path.join(args.out, "checkpoint.pt")
    start_epoch, step = 0, 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_epoch, step = state["epoch"], state["step"]
    metrics = open(args.metrics, "a") if rank == 0 else None
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if metrics:
                metrics.write(json.dumps({"step": step, "loss": loss.item(), "t": time.time()}) + "\n")
                metrics.flush()
        if rank == 0:
            state = {"model": model.module.state_dict(), "optim": opt.state_dict(),
                     "epoch": epoch + 1, "step": step}
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
