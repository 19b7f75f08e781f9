"""Another checkout's im2col / col2im (kernels.lowering, "old") against this checkout's baseline and AVX-512 builds.

Usage:  python packages/layers/bench/ab_lowering.py OLD_KERNELS_DIR [--repeats 15] [--rounds 5]

OLD_KERNELS_DIR holds the compiled kernels of another checkout (its lowering build). The shapes of the nets'
lowerings: LeNet conv1 / conv2 (valid, rows of 24 / 8), a CIFAR10-quick conv2 block (5x5 pad 2: "same", one run
per image), ResNet-50's 3x3 at 56x56 (batch 1), its conv1 (7x7 / 2 pad 3) and 1x1 / 2 and 3x3 / 2 layers
(strided rows), CaffeNet's conv1 (11x11 / 4) and conv3 (13x13 rows). For each: the three builds once on the same
inputs (the same bits is said), then medians (ms) of --rounds rounds of --repeats calls each, the builds in
alternating order.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import numpy as np

from ab_kernels import pair  # (this folder: the script's own, first on sys.path)


def cases(rng):
    def arr(*shape):
        return rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
    out = []
    # (name, im (N, C, H, W), kernel, pad, stride, OH, OW, images per block)
    for name, (N, C, H, W), k, p, s, nb in (
            ("LeNet conv2", (64, 20, 12, 12), (5, 5), (0, 0), (1, 1), 64),
            ("LeNet conv1", (64, 1, 28, 28), (5, 5), (0, 0), (1, 1), 64),
            ("CIFAR10-quick conv2 block", (10, 32, 16, 16), (5, 5), (2, 2), (1, 1), 10),
            ("ResNet-50 3x3 56x56 b1", (1, 64, 56, 56), (3, 3), (1, 1), (1, 1), 1),
            ("ResNet-50 conv1 b8", (8, 3, 224, 224), (7, 7), (3, 3), (2, 2), 8),
            ("ResNet-50 1x1/2 b8", (8, 256, 56, 56), (1, 1), (0, 0), (2, 2), 8),
            ("3x3/2 pad 1 b8", (8, 128, 56, 56), (3, 3), (1, 1), (2, 2), 8),
            ("CaffeNet conv1 b8", (8, 3, 227, 227), (11, 11), (0, 0), (4, 4), 8),
            ("CaffeNet conv3 b8", (8, 256, 13, 13), (3, 3), (1, 1), (1, 1), 8)):
        OH, OW = (H + 2 * p[0] - k[0]) // s[0] + 1, (W + 2 * p[1] - k[1]) // s[1] + 1
        rows, P = C * k[0] * k[1], OH * OW
        im, col = arr(nb, C, H, W), arr(rows, nb * P)
        geo = (nb, C, H, W, k[0], k[1], p[0], p[1], s[0], s[1], 1, 1, OH, OW, nb * P, P)
        out.append((f"{name} im2col", lambda m, im=im, col=col, geo=geo: m.im2col_2d(im, col, *geo), col))
        if name not in ("LeNet conv1", "ResNet-50 conv1 b8", "CaffeNet conv1 b8", "ResNet-50 1x1/2 b8"):
            out.append((f"{name} col2im", lambda m, im=im, col=col, geo=geo: m.col2im_2d(col, im, *geo), im))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_dir")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    old, base = pair("lowering", a.old_dir)
    avx512 = importlib.import_module("caffe.layers.kernels.lowering_avx512")
    builds = (("old", old), ("base", base), ("avx512", avx512))
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}; ms, medians of {a.rounds} rounds of {a.repeats}")
    for name, fn, out in cases(np.random.default_rng(0)):
        results = []
        for _, m in builds:
            fn(m)
            results.append(out.copy())
        same = all(np.array_equal(r.view(np.uint32), results[0].view(np.uint32)) for r in results[1:])
        times = {b: [] for b, _ in builds}
        for r in range(a.rounds):
            for b, m in (builds if r % 2 == 0 else builds[::-1]):
                t = []
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    fn(m)
                    t.append(time.perf_counter() - t0)
                times[b].append(statistics.median(t) * 1e3)
        med = {b: statistics.median(v) for b, v in times.items()}
        print(f"{name:34s} old {med['old']:7.3f}  base {med['base']:7.3f}  avx512 {med['avx512']:7.3f}   "
              f"avx512/old {med['avx512'] / med['old']:.2f}  same bits: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
