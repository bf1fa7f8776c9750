"""torchvision's CIFAR training transforms, as a PyTorch DataLoader worker applies them: each
image of data_batch_1.bin as a PIL image through RandomCrop(32, padding=4),
RandomHorizontalFlip(), ToTensor() and Normalize(), stacked into batches of 512, in one thread.
bench_batch_assembly runs it as its peer and reads the last line ("torchvision images/s N").

    torch_batch_assembly.py --data DIR/cifar-10-batches-bin --images N
"""
import argparse
import time

import numpy as np
import torch
from PIL import Image
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--images", type=int, default=20480)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw = np.fromfile(f"{args.data}/data_batch_1.bin", dtype=np.uint8).reshape(-1, 3073)
    images = raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()  # HWC, as torchvision's CIFAR10
    transform = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ])
    start = time.perf_counter()
    done = 0
    while done < args.images:
        n = min(args.batch, args.images - done)
        batch = torch.stack([transform(Image.fromarray(images[(done + i) % len(images)])) for i in range(n)])
        assert batch.shape == (n, 3, 32, 32)
        done += n
    print(f"torchvision images/s {done / (time.perf_counter() - start):.1f}")


if __name__ == "__main__":
    main()
