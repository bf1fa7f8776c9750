#!/usr/bin/python3
"""PyTorch reference for model_test / torch_reference_test.

Usage: torch_reference.py DIR MODE
  MODE resnet: reads DIR/meta.txt ("depth width in_channels classes n h w"), DIR/params.txt
    ("name offset count" per line, dtrain's flat layout), DIR/params.bin, DIR/images.bin,
    DIR/labels.bin; runs one training forward + cross-entropy + backward with bench/train/torch_resnet.py's
    ResNet (CIFAR stem, torchvision layout) and writes DIR/out_loss.txt, DIR/out_logits.bin, DIR/out_grads.bin (flat
    layout), DIR/out_buffers.bin (running mean/var per BN in forward order).
  MODE optim: reads DIR/optim.txt ("kind lr momentum nesterov wd steps n"), DIR/p0.bin and
    DIR/g.bin (steps * n gradients); applies torch.optim.SGD/Adam; writes DIR/out_p.bin.
Exit code 77 when torch is missing (the C++ test skips).
"""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

# The one PyTorch spelling of dtrain's ResNet, shared with the benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "train"))
from torch_resnet import ResNet  # noqa: E402


def run_resnet(d):
    depth, width, in_ch, classes, n, h, w = map(int, open(d + "/meta.txt").read().split())
    layout = [l.split() for l in open(d + "/params.txt").read().splitlines()]
    flat = np.fromfile(d + "/params.bin", dtype=np.float32)
    model = ResNet(depth, width, in_ch, classes)
    params = dict(model.named_parameters())
    assert len(params) == len(layout), (len(params), len(layout))
    with torch.no_grad():
        for name, off, cnt in layout:
            p = params[name]
            assert p.numel() == int(cnt), name
            p.copy_(torch.from_numpy(flat[int(off):int(off) + int(cnt)].copy()).view_as(p))
    images = torch.from_numpy(np.fromfile(d + "/images.bin", dtype=np.float32)).view(n, in_ch, h, w)
    labels = torch.from_numpy(np.fromfile(d + "/labels.bin", dtype=np.int32).astype(np.int64))
    model.train()
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = np.zeros_like(flat)
    for name, off, cnt in layout:
        grads[int(off):int(off) + int(cnt)] = params[name].grad.numpy().ravel()
    open(d + "/out_loss.txt", "w").write("%.9g\n" % loss.item())
    logits.detach().numpy().astype(np.float32).tofile(d + "/out_logits.bin")
    grads.tofile(d + "/out_grads.bin")
    bufs = [t.numpy().ravel() for name, t in model.named_buffers() if not name.endswith("num_batches_tracked")]
    np.concatenate(bufs).astype(np.float32).tofile(d + "/out_buffers.bin")


def run_optim(d):
    kind, lr, mom, nesterov, wd, steps, n = open(d + "/optim.txt").read().split()
    lr, mom, wd, steps, n = float(lr), float(mom), float(wd), int(steps), int(n)
    p = torch.nn.Parameter(torch.from_numpy(np.fromfile(d + "/p0.bin", dtype=np.float32)))
    g = torch.from_numpy(np.fromfile(d + "/g.bin", dtype=np.float32)).view(steps, n)
    if kind == "sgd":
        opt = torch.optim.SGD([p], lr=lr, momentum=mom, nesterov=nesterov == "1", weight_decay=wd)
    else:
        opt = torch.optim.Adam([p], lr=lr, weight_decay=wd)
    for s in range(steps):
        p.grad = g[s].clone()
        opt.step()
    p.detach().numpy().tofile(d + "/out_p.bin")


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"resnet": run_resnet, "optim": run_optim}[sys.argv[2]](sys.argv[1])
