"""What a PyTorch worker asks the job's store while its process groups start, counted by the
store itself: every rank runs the phases named on the command line (init: init_process_group
with gloo; new_group: a group of every rank; barrier: the store-based barrier PyTorch runs when
TORCH_DIST_INIT_BARRIER=1 is set), then rank 0 reads the agent's /status (the store's counts by
op) once every rank is past its last store request, and writes it to --output, with the number
of connections the store held at each reading.

The phases after init are separated by a gloo barrier, which runs over the process group's own
connections, not through the store, so it adds nothing to the counts.
"""
import argparse
import json
import os
import urllib.request

import torch.distributed as dist


def store_status(status_urls):
    """The store's section of /status, from the agent that hosts the store: --status_url may
    name several agents (comma-separated; with c10d, whichever bound the endpoint hosts it)."""
    for url in status_urls.split(","):
        with urllib.request.urlopen(url, timeout=60) as reply:
            status = json.load(reply)
        if status.get("store"):
            return status["store"]
    raise RuntimeError(f"no agent at {status_urls} reports a store")


def store_counts(status_urls, connections):
    store = store_status(status_urls)
    connections.append(store["connections"])
    return store["requests_by_op"]["workers"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--status_url", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--phases", default="init")
    args = p.parse_args()
    phases = args.phases.split(",")
    rank = int(os.environ["RANK"])
    counts = {}
    connections = []  # the store's open connections, when each count was read
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == 0:
        counts["init"] = store_counts(args.status_url, connections)
    dist.barrier()
    if "new_group" in phases:
        group = dist.new_group(list(range(dist.get_world_size())))
        dist.barrier(group=group)
        if rank == 0:
            counts["new_group"] = store_counts(args.status_url, connections)
        dist.barrier()
    if rank == 0:
        with open(args.output, "w") as f:
            json.dump({"world_size": dist.get_world_size(), "counts": counts,
                       "connections": connections}, f)
    dist.barrier()


if __name__ == "__main__":
    main()
