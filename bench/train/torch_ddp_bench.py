#!/usr/bin/python3
"""PyTorch's training throughput (1.13 eager; 2.x eager or torch.compile with --compile) for the ResNet of torch_resnet.py: forward, loss, backward
(DDP over gloo when WORLD_SIZE > 1) and an SGD step on a fixed random batch (no data loading:
PyTorch's best case). Prints one JSON line on rank 0 with the whole job's images/s.

  /usr/bin/python3 bench/train/torch_ddp_bench.py --width 16 --batch_size 128 --threads 2
  /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 -r 1 -t 1 \\
      bench/train/torch_ddp_bench.py --width 16 --threads 1

On a GPU (scripts/gpu_check.sh runs it so, beside dtrain): --device cuda --precision bf16
--channels_last is PyTorch's usual fast eager recipe (autocast bf16, NHWC); fp16 adds a GradScaler.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_amp_step import make_step  # noqa: E402
from torch_resnet import ResNet  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=18)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu | cuda (GPU LOCAL_RANK)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--channels_last", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the (DDP) model (PyTorch 2.x; the warm-up steps compile)")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(rank)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = ResNet(args.depth, args.width).to(device, memory_format=memory_format)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(args.batch_size, 3, 32, 32, device=device).to(memory_format=memory_format)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    model.train()
    train_step = make_step(model, opt, device.type, args.precision)

    def step():
        train_step(x, y)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    if world > 1:
        dist.barrier()
    t0 = time.time()
    for _ in range(args.steps):
        step()
    sync()
    if world > 1:
        dist.barrier()
    secs = time.time() - t0
    if rank == 0:
        print(json.dumps({"images_per_s": world * args.batch_size * args.steps / secs,
                          "world_size": world, "threads": args.threads, "width": args.width,
                          "batch_size": args.batch_size, "steps": args.steps,
                          "device": args.device, "precision": args.precision,
                          "channels_last": args.channels_last, "compile": args.compile,
                          "torch": torch.__version__}), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
