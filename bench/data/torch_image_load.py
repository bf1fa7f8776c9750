#!/usr/bin/env python3
"""The peers of bench_image_load: load and decode every image of an ImageFolder tree into memory.

  torch_image_load.py imagefolder DIR RUNS     torchvision.datasets.ImageFolder (default loader:
                                               PIL open + convert("RGB")), one process, each image
                                               kept as RGB bytes
  torch_image_load.py dataloader DIR RUNS W    the same through DataLoader(num_workers=W,
                                               batch_size=256) with PILToTensor (uint8 batches)
  torch_image_load.py piltar ARCHIVE RUNS      PIL alone on the archive read in place (tarfile)

Each prints one line per run and the median.
"""
import io
import statistics
import sys
import tarfile
import time


def run_imagefolder(root):
    from torchvision.datasets import ImageFolder
    images = []
    for split in ("train", "test"):
        ds = ImageFolder(f"{root}/{split}")
        for i in range(len(ds)):
            img, label = ds[i]
            images.append((img.tobytes(), label))
    return len(images)


def run_dataloader(root, workers):
    import torch
    from torchvision import transforms
    from torchvision.datasets import ImageFolder
    n = 0
    batches = []
    for split in ("train", "test"):
        ds = ImageFolder(f"{root}/{split}", transform=transforms.PILToTensor())
        loader = torch.utils.data.DataLoader(ds, batch_size=256, num_workers=workers)
        for x, y in loader:
            batches.append((x, y))
            n += len(y)
    return n


def run_piltar(archive):
    from PIL import Image
    images = []
    with tarfile.open(archive) as tar:
        for m in tar:
            if m.isfile() and m.name.lower().endswith((".jpg", ".jpeg", ".png")):
                with Image.open(io.BytesIO(tar.extractfile(m).read())) as im:
                    images.append(im.convert("RGB").tobytes())
    return len(images)


def main():
    mode, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    secs = []
    for r in range(runs):
        t0 = time.perf_counter()
        if mode == "imagefolder":
            n = run_imagefolder(path)
        elif mode == "dataloader":
            n = run_dataloader(path, int(sys.argv[4]))
        else:
            n = run_piltar(path)
        dt = time.perf_counter() - t0
        secs.append(dt)
        print(f"{mode} run {r + 1}: {n} images in {dt:.3f} s", flush=True)
    print(f"{mode} median {statistics.median(secs):.3f} s over {runs} runs")


if __name__ == "__main__":
    main()
