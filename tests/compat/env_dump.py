"""Writes this worker's whole environment to DIR/env.<RANK> (DIR: the first argument), one
NAME=VALUE line per variable, sorted, the value backslash-escaped (unicode_escape) so that every
variable is one line; for torch_compat_test.cc, which compares the environments torchrun and
dlaunch give the same command. Imports nothing of torch: the environment is the launcher's.
"""
import os
import sys

lines = [f"{k}={v.encode('unicode_escape').decode('ascii')}\n"
         for k, v in sorted(os.environ.items())]
with open(os.path.join(sys.argv[1], f"env.{os.environ['RANK']}"), "w") as f:
    f.writelines(lines)
