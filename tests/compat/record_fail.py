"""A worker decorated with PyTorch's @record that raises on one rank. @record writes the
exception (message and traceback) to TORCHELASTIC_ERROR_FILE before re-raising; the launcher
is expected to put that message in its failure report. The other ranks wait to be stopped.
"""
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == int(os.environ.get("COMPAT_FAIL_RANK", "1")):
        raise ValueError(f"compat: deliberate failure on rank {rank} of {os.environ['WORLD_SIZE']}")
    time.sleep(120)


if __name__ == "__main__":
    main()
