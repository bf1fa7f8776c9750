#!/usr/bin/python3
"""The peer for rendezvous_bench: PyTorch's own c10d rendezvous (what torchrun runs), in the
interpreter that runs this script (Debian's 1.13, or e.g. the 2.15 venv of setup_torch2.sh).

N agent processes on 127.0.0.1 import torch first; then all are released at once and each runs
get_rendezvous_handler(c10d).next_rendezvous(). Time = from the release to the last return, so
Python start-up and `import torch` are not counted (dlaunch's figure includes its fork+connect).
The first process binds the endpoint and hosts PyTorch's TCPStore, as torchrun does.

    /usr/bin/python3 bench/rendezvous/torch_c10d_bench.py --agents 2,8,32 [--repeat 1]
    ~/.cache/dlaunch/venv-torch-2.15.0/bin/python bench/rendezvous/torch_c10d_bench.py --agents 32
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
n, port, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="bench",
                              min_nodes=n, max_nodes=n, join_timeout=600)
handler = get_rendezvous_handler(params)
info = handler.next_rendezvous()  # 1.13: (store, rank, world); 2.x: a RendezvousInfo
rank, world = (info[1], info[2]) if isinstance(info, tuple) else (info.rank, info.world_size)
print("done", time.monotonic(), rank, world, flush=True)
while not os.path.exists(go + ".exit"):  # the host's store must outlive everyone's rendezvous
    time.sleep(0.01)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(n):
    port = free_port()
    go = os.path.join(tempfile.mkdtemp(), "go")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(n), str(port), go],
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    start = time.monotonic()
    open(go, "w").close()
    ends = []
    for p in procs:
        line = p.stdout.readline().split()
        if not line or line[0] != "done":
            raise SystemExit("an agent failed")
        ends.append(float(line[1]))
    open(go + ".exit", "w").close()
    for p in procs:
        p.wait()
    return max(ends) - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", default="2,8,32")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(f"PyTorch c10d rendezvous (torch {__import__('torch').__version__}), "
          f"median of {args.repeat}")
    for n in [int(x) for x in args.agents.split(",")]:
        times = [run_once(n) for _ in range(args.repeat)]
        print(f"{n:5d} agents: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f})", flush=True)


if __name__ == "__main__":
    main()
