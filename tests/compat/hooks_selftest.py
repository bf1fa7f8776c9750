"""Checks dlaunch's sitecustomize (python/dlaunch_hooks) inside one interpreter, for
torch_compat_test.cc. Run with the hooks first on PYTHONPATH and DLAUNCH_HEARTBEAT_FILE set.

  hooks_selftest.py real    the PyTorch of this python: SGD, Adam and a subclass of SGD touch
                            the heartbeat file, at most every 100 ms. 1.13: each optimizer
                            class's step is wrapped, once however many instances; 2.x: one
                            global step post hook, and no class is wrapped.
  hooks_selftest.py fake2   a stand-in torch package with PyTorch 2.x's global
                            register_optimizer_step_post_hook (no PyTorch 2 here): the hooks use
                            it instead of wrapping.
Prints "selftest ok" at the end; any failed check raises.
"""
import os
import sys
import tempfile
import time

BEAT = os.environ["DLAUNCH_HEARTBEAT_FILE"]


def mtime():
    return os.stat(BEAT).st_mtime_ns if os.path.exists(BEAT) else 0


def real():
    assert "torch" not in sys.modules, "the hooks imported torch"
    import torch

    class MySGD(torch.optim.SGD):  # a user's subclass that keeps SGD's step
        pass

    import torch.optim.optimizer as optimizer

    global_hook = hasattr(optimizer, "register_optimizer_step_post_hook")
    assert global_hook == (int(torch.__version__.split(".")[0]) >= 2), torch.__version__
    if global_hook:
        hooks = list(optimizer._global_optimizer_post_hooks.values())
        assert [h.__module__ for h in hooks] == ["sitecustomize"], f"global hooks: {hooks}"
    p = torch.nn.Parameter(torch.ones(2))
    for make in (lambda: torch.optim.SGD([p], lr=0.1), lambda: torch.optim.Adam([p]),
                 lambda: MySGD([p], lr=0.1)):
        opt = make()
        make()  # a second instance must not wrap the class again
        step = type(opt).step
        if global_hook:
            assert not getattr(step, "_dlaunch_beats", False), f"{type(opt).__name__} wrapped"
        else:
            assert getattr(step, "_dlaunch_beats", False), f"{type(opt).__name__}.step not hooked"
            assert not getattr(step.__wrapped__, "_dlaunch_beats", False), "wrapped twice"
        before = mtime()
        time.sleep(0.15)
        p.grad = torch.ones(2)
        opt.step()
        assert mtime() > before, f"{type(opt).__name__}.step did not beat"
        # Within 100 ms of a beat, no new touch.
        after = mtime()
        opt.step()
        assert mtime() == after, "beat again within 100 ms"


# PyTorch 2.x's API as torch/optim/optimizer.py defines it (2.0 through 2.8 alike): a module-level
# register_optimizer_step_post_hook(hook) -> RemovableHandle that stores the hook in the
# _global_optimizer_post_hooks OrderedDict, and every optimizer's step calls each of them as
# hook(optimizer, args, kwargs) after the step (profile_hook_step's wrapper).
FAKE_OPTIMIZER = '''
from collections import OrderedDict
_global_optimizer_post_hooks = OrderedDict()
class RemovableHandle:
    def __init__(self, hooks):
        self.id = len(hooks)
class Optimizer:
    def __init__(self, params, defaults):
        pass
    def step(self, *args, **kwargs):
        for post_hook in _global_optimizer_post_hooks.values():
            post_hook(self, args, kwargs)
def register_optimizer_step_post_hook(hook):
    handle = RemovableHandle(_global_optimizer_post_hooks)
    _global_optimizer_post_hooks[handle.id] = hook
    return handle
'''


def fake2():
    root = tempfile.mkdtemp()
    os.makedirs(os.path.join(root, "torch", "optim"))
    open(os.path.join(root, "torch", "__init__.py"), "w").close()
    with open(os.path.join(root, "torch", "optim", "__init__.py"), "w") as f:
        f.write("from .optimizer import Optimizer\n")
    with open(os.path.join(root, "torch", "optim", "optimizer.py"), "w") as f:
        f.write(FAKE_OPTIMIZER)
    sys.path.insert(0, root)
    import torch.optim.optimizer as optimizer

    assert len(optimizer._global_optimizer_post_hooks) == 1, "the 2.x global hook was not registered"
    assert optimizer.Optimizer.__init__.__qualname__ == "Optimizer.__init__", "wrapped on 2.x"
    before = mtime()
    time.sleep(0.15)
    optimizer.Optimizer(None, {}).step()
    assert mtime() > before, "the 2.x hook did not beat"


{"real": real, "fake2": fake2}[sys.argv[1]]()
print("selftest ok", flush=True)
