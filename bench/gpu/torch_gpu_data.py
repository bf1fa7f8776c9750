"""CIFAR-10 held on the training device as uint8, and dtrain's training augmentation written with
tensor ops on that device: the PyTorch side of bench/gpu (issue 11). dtrain does the same in its
augment_batch op (kernels/augment.h): pad-and-crop with zeros, a horizontal flip drawn per image
(or airbench's alternating flip: one coin per image for the run, inverted every other epoch), and
cutout after normalisation (the square set to 0, the mean pixel), each square wholly inside the
image. The draws differ from dtrain's (torch's generator, not SplitMix64): the same recipe, not
the same images.

Sources: ../shared/data/cifar-10-jpeg.tar.gz (cifar-10-jpeg/{train,test}/<class>/NNNN.jpg, the
classes in sorted order as dtrain's image folders), decoded with torchvision or PIL, whichever is
installed; a cifar-10-batches-bin directory (the binary batches: no decoder needed, the CPU
self-test uses it); or "synthetic" (random images, for throughput).
"""
import io
import os
import tarfile

import torch
import torch.nn.functional as F

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _decoder():
    try:
        import torchvision.io as tvio

        def decode(data):
            return tvio.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))

        return decode
    except ImportError:
        pass
    try:
        import numpy as np
        from PIL import Image

        def decode(data):
            img = Image.open(io.BytesIO(data)).convert("RGB")
            return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)

        return decode
    except ImportError:
        raise SystemExit("torch_gpu_data: decoding the JPEG archive needs torchvision or PIL, and "
                         "neither imports here; pass a cifar-10-batches-bin directory or 'synthetic'")


def _load_archive(path):
    decode = _decoder()
    splits = {"train": {}, "test": {}}
    with tarfile.open(path) as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 4 or parts[-3] not in splits:
                continue
            splits[parts[-3]].setdefault(parts[-2], []).append((parts[-1], tar.extractfile(member).read()))
    out = []
    classes = sorted(splits["train"])
    for name in ("train", "test"):
        images, labels = [], []
        for label, cls in enumerate(classes):
            for _, data in sorted(splits[name].get(cls, [])):
                images.append(decode(data))
                labels.append(label)
        if not images:
            raise SystemExit(f"torch_gpu_data: {path} has no {name}/<class>/*.jpg images")
        out += [torch.stack(images), torch.tensor(labels, dtype=torch.int64)]
    return out


def _load_binary(directory):
    def read(names):
        raw = b"".join(open(os.path.join(directory, n), "rb").read() for n in names)
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 3073)
        return t[:, 1:].reshape(-1, 3, 32, 32).clone(), t[:, 0].to(torch.int64)

    train = sorted(n for n in os.listdir(directory) if n.startswith("data_batch_"))
    if not train or not os.path.exists(os.path.join(directory, "test_batch.bin")):
        raise SystemExit(f"torch_gpu_data: {directory} holds no data_batch_*.bin and test_batch.bin")
    return [*read(train), *read(["test_batch.bin"])]


def load_cifar(source, device, train_limit=0, test_limit=0, seed=0):
    """(train_x, train_y, test_x, test_y) on `device`, images uint8 N x 3 x 32 x 32."""
    if source == "synthetic":
        g = torch.Generator().manual_seed(seed)
        parts = [torch.randint(0, 256, (50000, 3, 32, 32), dtype=torch.uint8, generator=g),
                 torch.randint(0, 10, (50000,), generator=g),
                 torch.randint(0, 256, (10000, 3, 32, 32), dtype=torch.uint8, generator=g),
                 torch.randint(0, 10, (10000,), generator=g)]
    elif os.path.isdir(source):
        parts = _load_binary(source)
    else:
        parts = _load_archive(source)
    if train_limit:
        parts[0], parts[1] = parts[0][:train_limit], parts[1][:train_limit]
    if test_limit:
        parts[2], parts[3] = parts[2][:test_limit], parts[3][:test_limit]
    return [p.to(device) for p in parts]


def normalise(u8, dtype=torch.float32, channels_last=False):
    mean = torch.tensor(MEAN, device=u8.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=u8.device).view(1, 3, 1, 1) * 255
    x = ((u8.to(torch.float32) - mean) / std).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


class Augment:
    """One epoch's training images at a time: crop, flip, normalise, cutout, all on the device."""

    def __init__(self, n, device, seed, pad=4, cutout=0, alternating_flip=False):
        self.device, self.pad, self.cutout, self.alternating = device, pad, cutout, alternating_flip
        self.seed = seed
        g = torch.Generator(device=device).manual_seed(seed)
        self.run_coin = torch.randint(0, 2, (n,), device=device, generator=g).bool()

    def epoch(self, images, epoch, dtype=torch.float32, channels_last=False):
        n, _, h, w = images.shape
        g = torch.Generator(device=self.device).manual_seed(self.seed * 1000003 + epoch + 1)
        p = self.pad
        padded = F.pad(images, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (n, 1), device=self.device, generator=g)
        dx = torch.randint(0, 2 * p + 1, (n, 1), device=self.device, generator=g)
        rows = (dy + torch.arange(h, device=self.device)).view(n, 1, h, 1)
        cols = (dx + torch.arange(w, device=self.device)).view(n, 1, 1, w)
        idx_n = torch.arange(n, device=self.device).view(n, 1, 1, 1)
        idx_c = torch.arange(3, device=self.device).view(1, 3, 1, 1)
        out = padded[idx_n, idx_c, rows, cols]
        if self.alternating:
            flip = self.run_coin ^ bool(epoch % 2)
        else:
            flip = torch.randint(0, 2, (n,), device=self.device, generator=g).bool()
        out = torch.where(flip.view(n, 1, 1, 1), out.flip(3), out)
        x = normalise(out, dtype)
        if self.cutout:
            s = self.cutout
            cy = torch.randint(0, h - s + 1, (n, 1), device=self.device, generator=g)
            cx = torch.randint(0, w - s + 1, (n, 1), device=self.device, generator=g)
            ar_h = torch.arange(h, device=self.device).view(1, h)
            ar_w = torch.arange(w, device=self.device).view(1, w)
            in_rows = (ar_h >= cy) & (ar_h < cy + s)
            in_cols = (ar_w >= cx) & (ar_w < cx + s)
            keep = ~(in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w))
            x = x * keep.to(dtype)
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x
