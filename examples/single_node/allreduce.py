"""A tiny PyTorch job for dlaunch: every rank all-reduces its rank over gloo (CPU) and checks
the sum. Run it with Debian's torch (its interpreter is /usr/bin/python3):

    build/bin/dlaunch --standalone --nproc_per_node 2 --python /usr/bin/python3 \
        examples/single_node/allreduce.py

With TORCHELASTIC_USE_AGENT_STORE=True (set by dlaunch) the workers join the agent's TCP store
through MASTER_ADDR/MASTER_PORT instead of rank 0 binding its own port.
"""
import os
import signal

import torch
import torch.distributed as dist


def heartbeat():
    """Touch the heartbeat file so `--hang_timeout` knows this worker makes progress."""
    path = os.environ.get("DLAUNCH_HEARTBEAT_FILE")
    if path:
        with open(path, "a"):
            os.utime(path, None)


def main():
    import faulthandler

    # `kill -USR2 <dlaunch pid>` then prints every worker's Python stack to its stderr.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    heartbeat()
    expected = world * (world - 1) / 2
    assert t.item() == expected, (t.item(), expected)
    print(f"rank {rank}/{world}: all_reduce sum {t.item():.0f} (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}, "
          f"agent store {os.environ['TORCHELASTIC_USE_AGENT_STORE']})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
