"""Prints what dlaunch's Python hooks changed in this process, for torch_compat_test.cc:
  probe: torch_imported=0|1 user_sitecustomize=<value or -> stack_file=<DLAUNCH_PY_STACK_FILE or ->
The user's own sitecustomize (put on PYTHONPATH by the test) sets builtins.compat_user_site."""
import builtins
import os
import sys

print(
    "probe: torch_imported={} user_sitecustomize={} stack_file={}".format(
        int("torch" in sys.modules),
        getattr(builtins, "compat_user_site", "-"),
        os.environ.get("DLAUNCH_PY_STACK_FILE", "-"),
    ),
    flush=True,
)
