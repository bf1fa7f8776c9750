# dlaunch's hooks for Python workers, installed and owned by dlaunch (docs/troubleshooting.md,
# "My job hangs"). dlaunch puts this directory first on the workers' PYTHONPATH, so Python's
# `site` imports this file at start-up; nothing else of the worker changes. Two jobs:
#
# 1. Python stacks on request: faulthandler dumps every thread's stack into
#    DLAUNCH_PY_STACK_FILE when the process gets signal DLAUNCH_PY_STACK_SIGNAL (a real-time
#    signal, so no handler of the script is taken). dlaunch sends it to a hung worker before it
#    captures the native stacks. The file starts with a registration line; dlaunch signals only
#    processes that registered (an unregistered one would die of the signal).
# 2. Heartbeats with no code changes: every optimizer step of every torch.optim.Optimizer
#    touches DLAUNCH_HEARTBEAT_FILE (at most once per 100 ms), so --hang_timeout sees a training
#    loop that stops. torch is hooked when the script imports it, never imported from here.
#
# Then the sitecustomize this one shadows (Debian's, a virtualenv's, the user's) is run, as if
# this file were not there. Turn all of it off with dlaunch --no_python_hooks.
import os
import sys
import time

_HEARTBEAT_MIN_INTERVAL = 0.1  # seconds; common/heartbeat.h's kHeartbeatMinInterval
_OPTIMIZER_MODULE = "torch.optim.optimizer"

_heartbeat_file = os.environ.get("DLAUNCH_HEARTBEAT_FILE", "")
_last_beat = 0.0
_stack_file = None  # kept open: faulthandler writes to its descriptor from the signal handler


def _beat(*_args, **_kwargs):
    global _last_beat
    now = time.monotonic()
    if now - _last_beat < _HEARTBEAT_MIN_INTERVAL:
        return
    _last_beat = now
    try:
        os.utime(_heartbeat_file)
    except FileNotFoundError:
        try:
            open(_heartbeat_file, "a").close()
        except OSError:
            pass
    except OSError:
        pass


def _wrap_step(cls):
    """PyTorch 1.x: wraps the step that cls uses so that it beats after each call (once)."""
    import functools

    owner = next((c for c in cls.__mro__ if "step" in c.__dict__), None)
    if owner is None:
        return
    step = owner.__dict__["step"]
    if getattr(step, "_dlaunch_beats", False):
        return

    @functools.wraps(step)  # keeps torch's own "hooked" mark (Optimizer._hook_for_profile)
    def step_and_beat(*args, **kwargs):
        result = step(*args, **kwargs)
        _beat()
        return result

    step_and_beat._dlaunch_beats = True
    owner.step = step_and_beat


def _hook_optimizers(module):
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is not None:  # PyTorch 2.x: one global hook for every optimizer
        register(_beat)
        return
    # PyTorch 1.13: no global hook. Each subclass defines its own step, so wrap it when the
    # first instance of the class is made (torch does the same for its profiler).
    optimizer = module.Optimizer
    init = optimizer.__init__

    def init_and_hook(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _wrap_step(type(self))

    optimizer.__init__ = init_and_hook


class _OptimizerImportHook:
    """A meta path finder that waits for torch.optim.optimizer to be imported and hooks it then.

    Only a module's first import consults sys.meta_path, and this finder answers every other
    name with one string comparison, so a script that never imports torch pays nothing more.
    """

    def find_spec(self, name, path=None, target=None):
        if name != _OPTIMIZER_MODULE:
            return None
        sys.meta_path.remove(self)  # once is enough; also keeps the search below from recursing
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_hook(module):
            exec_module(module)
            try:
                _hook_optimizers(module)
            except Exception as e:  # never break the user's import of torch
                sys.stderr.write(f"dlaunch: optimizer heartbeats are off: {e!r}\n")

        spec.loader.exec_module = exec_and_hook
        return spec


def _install_heartbeats():
    if not _heartbeat_file:
        return
    module = sys.modules.get(_OPTIMIZER_MODULE)
    if module is not None:
        _hook_optimizers(module)
    else:
        sys.meta_path.insert(0, _OptimizerImportHook())


def _install_stack_dump():
    global _stack_file
    path = os.environ.get("DLAUNCH_PY_STACK_FILE", "")
    try:
        signum = int(os.environ.get("DLAUNCH_PY_STACK_SIGNAL", "0"))
    except ValueError:
        return
    if not path or signum <= 0:
        return
    import faulthandler

    try:
        _stack_file = open(path, "a", buffering=1)
        faulthandler.register(signum, file=_stack_file, all_threads=True, chain=False)
        _stack_file.write(f"dlaunch-python-stacks pid={os.getpid()} signal={signum}\n")
    except (OSError, ValueError, RuntimeError) as e:
        sys.stderr.write(f"dlaunch: no Python stacks on a hang: {e!r}\n")


def _run_shadowed_sitecustomize():
    """Runs the sitecustomize that this one hides on sys.path, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # what the shadowed file sees of itself
    spec.loader.exec_module(module)


_install_stack_dump()
_install_heartbeats()
# Last, and not caught: an error in it is reported by `site` as it would be without dlaunch.
_run_shadowed_sitecustomize()
