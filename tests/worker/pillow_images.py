#!/usr/bin/env python3
"""Pillow's side of image_folder_test.cc: what torchvision's default loader,
Image.open(f).convert("RGB"), makes of an image file.

  pillow_images.py make DIR        writes images in many colour types to DIR, each with
                                   <name>.rgb beside it: Pillow's RGB bytes (HWC) of the file
  pillow_images.py crc ARCHIVE OUT for every .jpg/.jpeg/.png member of a tar archive, a line
                                   "<member> <width> <height> <crc32 of Pillow's RGB bytes>"
  pillow_images.py transform DIR S for every .jpg in DIR, what torchvision 0.14's transforms do to
                                   it on a PIL image (RGB bytes, HWC): <name>.eval =
                                   CenterCrop(S)(Resize(int(S * 256 / 224))(im)), <name>.crop =
                                   resized_crop(im, crop_box(h, w), (S, S)); prints
                                   "<name> <top> <left> <height> <width>" (the crop box)
"""
import io
import random
import struct
import sys
import tarfile
import zlib

from PIL import Image


def rgb_bytes(path_or_file):
    with Image.open(path_or_file) as im:
        return im.convert("RGB").tobytes()


def noise_image(mode, size, seed):
    rng = random.Random(seed)
    w, h = size
    # Smooth gradients plus noise: JPEG artefacts and chroma upsampling both show.
    im = Image.new("RGB", size)
    im.putdata([((x * 255 // w + rng.randrange(40)) % 256, (y * 255 // h + rng.randrange(40)) % 256,
                 rng.randrange(256)) for y in range(h) for x in range(w)])
    return im.convert(mode) if mode != "RGB" else im


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(path, width, height, depth, colour, rows):
    """A PNG written by hand, for what Pillow does not write (16-bit RGB)."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    data = b"".join(b"\0" + r for r in rows)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
                png_chunk(b"IDAT", zlib.compress(data)) + png_chunk(b"IEND", b""))


def make(directory):
    size = (37, 23)  # odd sizes: partial MCUs, odd chroma edges
    files = []
    base = noise_image("RGB", size, 1)
    base.save(f"{directory}/rgb_q75_420.jpg", quality=75)
    base.save(f"{directory}/rgb_q95_444.jpg", quality=95, subsampling=0)
    base.save(f"{directory}/rgb_q90_422.jpg", quality=90, subsampling=1)
    base.save(f"{directory}/rgb_progressive.jpg", quality=80, progressive=True)
    base.convert("L").save(f"{directory}/gray.jpg", quality=85)
    base.convert("CMYK").save(f"{directory}/cmyk.jpg", quality=90)
    base.save(f"{directory}/rgb.png")
    rgba = base.convert("RGBA")
    rgba.putalpha(noise_image("L", size, 2))
    rgba.save(f"{directory}/rgba.png")
    base.convert("L").save(f"{directory}/gray.png")
    la = base.convert("LA")
    la.putalpha(noise_image("L", size, 3))
    la.save(f"{directory}/gray_alpha.png")
    base.convert("1").save(f"{directory}/bilevel.png")
    pal = base.convert("P", palette=Image.ADAPTIVE, colors=200)
    pal.info["transparency"] = 5
    pal.save(f"{directory}/palette_trns.png", transparency=5)
    base.convert("P", palette=Image.ADAPTIVE, colors=16).save(f"{directory}/palette_4bit.png", bits=4)
    gray16 = Image.new("I;16", size)
    gray16.putdata([(i * 397) % 65536 for i in range(size[0] * size[1])])
    gray16.save(f"{directory}/gray16.png")
    rng = random.Random(4)
    raw_png(f"{directory}/rgb16.png", size[0], size[1], 16, 2,
            [bytes(rng.randrange(256) for _ in range(size[0] * 6)) for _ in range(size[1])])
    for name in ["rgb_q75_420.jpg", "rgb_q95_444.jpg", "rgb_q90_422.jpg", "rgb_progressive.jpg",
                 "gray.jpg", "cmyk.jpg", "rgb.png", "rgba.png", "gray.png", "gray_alpha.png",
                 "bilevel.png", "palette_trns.png", "palette_4bit.png", "gray16.png", "rgb16.png"]:
        with open(f"{directory}/{name}.rgb", "wb") as f:
            f.write(rgb_bytes(f"{directory}/{name}"))
        files.append(name)
    print("\n".join(files))


def crc(archive, out):
    with tarfile.open(archive) as tar, open(out, "w") as f:
        for member in tar:
            if not member.isfile() or not member.name.lower().endswith((".jpg", ".jpeg", ".png")):
                continue
            data = tar.extractfile(member).read()
            with Image.open(io.BytesIO(data)) as im:
                rgb = im.convert("RGB")
                f.write(f"{member.name} {rgb.width} {rgb.height} {zlib.crc32(rgb.tobytes())}\n")


def crop_box(h, w):
    """An off-centre crop, the same formula as image_folder_test.cc's."""
    return h // 5, w // 7, h // 2 + 1, 2 * w // 3


def transform(directory, size):
    """torchvision.transforms.functional on PIL images, written out (torchvision is not
    installed everywhere): resize = Image.resize((w, h), BILINEAR), crop = Image.crop."""
    import os
    size = int(size)
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jpg"):
            continue
        with Image.open(f"{directory}/{name}") as im:
            im = im.convert("RGB")
        w, h = im.size
        # Resize(int) of the shorter side: torchvision's _compute_resized_output_size.
        to = int(size * 256 / 224)
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = to, int(to * long / short)
        new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
        resized = im.resize((new_w, new_h), Image.BILINEAR)
        top = int(round((new_h - size) / 2.0))
        left = int(round((new_w - size) / 2.0))
        with open(f"{directory}/{name}.eval", "wb") as f:
            f.write(resized.crop((left, top, left + size, top + size)).tobytes())
        t, l, ch, cw = crop_box(h, w)
        crop = im.crop((l, t, l + cw, t + ch)).resize((size, size), Image.BILINEAR)
        with open(f"{directory}/{name}.crop", "wb") as f:
            f.write(crop.tobytes())
        print(name, t, l, ch, cw)


if __name__ == "__main__":
    {"make": make, "crc": crc, "transform": transform}[sys.argv[1]](*sys.argv[2:])
