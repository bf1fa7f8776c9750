"""A PyTorch worker that times its own start-up (CLOCK_MONOTONIC, comparable across processes):
  start      the process's creation (/proc/self/stat, 10 ms resolution)
  top        the script's first line (interpreter started)
  imported   `import torch.distributed` done
  init       init_process_group("gloo") returned (env://: under dlaunch the agent's store,
             under torchrun 1.13 a TCPStore that rank 0 hosts itself)
  allreduce  the first all_reduce (one float) returned
and prints them on one line for bench/agents/torch_init_bench.py.
"""
import os
import time

TOP = time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def process_start_ns():
    """The process's start on CLOCK_MONOTONIC: /proc gives it in clock ticks since boot."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_boot = int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    now_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    now_mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return now_mono - (now_boot - start_boot)


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

IMPORTED = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
dist.init_process_group("gloo")
INIT = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
t = torch.ones(1)
dist.all_reduce(t)
ALLREDUCE = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
assert t.item() == dist.get_world_size()
print(f"init-times rank={dist.get_rank()} start={process_start_ns()} top={TOP} imported={IMPORTED} "
      f"init={INIT} allreduce={ALLREDUCE}", flush=True)
dist.destroy_process_group()
