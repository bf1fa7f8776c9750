"""A plain torchrun-style DDP script (nothing dlaunch-specific): gloo on CPU, init_method env://,
a few SGD steps on a small regression problem. Used by tests/compat/torch_compat_test.cc, which
runs it unmodified under dlaunch (as `ddp_train.py` and as `-m ddp_train`), and by
scripts/gpu_check.sh on a GPU machine (PyTorch 2.x; `--backend nccl` puts each rank on GPU
LOCAL_RANK).

Each rank prints, for the test to compare:
  rank R/W: loss FIRST -> LAST steps=N (the loss averaged over ranks, before and after training)
  rank R/W: params sha256 HEX          (bytes of every parameter after the last step)
  rank R/W: store port=P listen_self=0|1 connected=0|1 owner_pid=PID
The store line says whether this process listens on MASTER_PORT itself (it must not when
TORCHELASTIC_USE_AGENT_STORE=True: PyTorch 1.13 then connects as a client only), whether it
holds a connection to MASTER_PORT, and which process on this host owns the listening socket
(the agent hosting the job's store).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def tcp_table():
    """(local_port, remote_port, state, inode) for every TCP socket in this network namespace."""
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local_port = int(parts[1].rsplit(":", 1)[1], 16)
                    remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                    rows.append((local_port, remote_port, parts[3], int(parts[9])))
        except FileNotFoundError:
            pass
    return rows


def socket_inodes(pid):
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def store_report(port):
    table = tcp_table()
    listeners = {inode for lp, _, state, inode in table if lp == port and state == "0A"}
    mine = socket_inodes(os.getpid())
    connected = any(rp == port and state == "01" and inode in mine
                    for _, rp, state, inode in table)
    owner = 0
    # The owner is usually our parent (the agent) or, for the other node's workers, another
    # dlaunch on this host: look at every process we may inspect.
    for entry in [str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
        if socket_inodes(entry) & listeners:
            owner = int(entry)
            break
    return int(bool(mine & listeners)), int(connected), owner


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args()

    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)  # env:// from MASTER_ADDR/PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

    listen_self, connected, owner = store_report(int(os.environ["MASTER_PORT"]))
    print(f"rank {rank}/{world}: store port={os.environ['MASTER_PORT']} listen_self={listen_self} "
          f"connected={connected} owner_pid={owner} "
          f"agent_store={os.environ.get('TORCHELASTIC_USE_AGENT_STORE', '')}", flush=True)

    torch.manual_seed(1 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    data = torch.Generator().manual_seed(1000 + rank)  # each rank has its own shard
    x = torch.randn(64, 8, generator=data)
    y = (x @ torch.linspace(-1.0, 1.0, 8).unsqueeze(1) + 0.5).to(device)
    x = x.to(device)

    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    mean = torch.tensor([losses[0], losses[-1]], dtype=torch.float64, device=device)
    dist.all_reduce(mean)
    mean /= world
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    print(f"rank {rank}/{world}: loss {mean[0].item():.6f} -> {mean[1].item():.6f} steps={args.steps}",
          flush=True)
    print(f"rank {rank}/{world}: params sha256 {digest.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
