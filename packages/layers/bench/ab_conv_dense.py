"""The dense direct convolution plan (conv_cpu "dense") against the plan it replaces, interleaved in one process.

Usage:  python packages/layers/bench/ab_conv_dense.py [--repeats 15] [--only cifar,caffenet] [--cpu-time]
            [--modes off,on | avx2,avx512 | off,avx512 ...]

Each case is one Convolution layer at a real net's shape (float32, random data and top diff). The
forward, the weight diff and the bottom diff (not for a net's first layer) are timed apart with
conv_cpu.DENSE = "off" (the blocked lowering + OpenBLAS GEMM, or the float64 exact path) and "on" (the
dense kernels wherever they can run), alternating which goes first, after a warm-up; the medians in ms,
the on/off ratios and the GFLOP/s are printed. The last column: the products that "auto" (the default,
conv_cpu.dense_products' measured rule) runs dense, or the plan it leaves the layer on. --cpu-time times by the process's CPU time
(both threads' work), less disturbed by other processes on a busy machine than the wall clock.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before NumPy loads (see bench_layers.py)

import numpy as np  # noqa: E402

from caffe.blob import Blob, context  # noqa: E402
from caffe.layers import conv_cpu  # noqa: E402
from caffe.layers.testing import make_layer  # noqa: E402


def _conv(num_output, kernel, pad, group=1):
    return (f"convolution_param {{ num_output: {num_output} kernel_size: {kernel} pad: {pad} group: {group} "
            "weight_filler { type: 'gaussian' std: 0.01 } bias_filler { type: 'constant' value: 0.1 } }")


# (family, name, bottom shape, num_output, kernel, pad, group, propagate_down)
CASES = [
    ("cifar", "cifar10_quick conv1 b100", (100, 3, 32, 32), 32, 5, 2, 1, False),
    ("cifar", "cifar10_quick conv2 b100", (100, 32, 16, 16), 32, 5, 2, 1, True),
    ("cifar", "cifar10_quick conv3 b100", (100, 32, 8, 8), 64, 5, 2, 1, True),
    ("lenet", "lenet conv2 b64", (64, 20, 12, 12), 50, 5, 0, 1, True),
    ("caffenet", "caffenet conv2 b8", (8, 96, 27, 27), 256, 5, 2, 2, True),
    ("caffenet", "caffenet conv3 b8", (8, 256, 13, 13), 384, 3, 1, 1, True),
    ("caffenet", "caffenet conv4 b8", (8, 384, 13, 13), 384, 3, 1, 2, True),
    ("caffenet", "caffenet conv5 b8", (8, 384, 13, 13), 256, 3, 1, 2, True),
] + [
    ("resnet", f"resnet50 3x3 {c}x{s}x{s} b{b}", (b, c, s, s), c, 3, 1, 1, True)
    for b in (1, 8) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))
] + [
    ("googlenet", f"googlenet {name} b8", (8, ci, s, s), co, k, k // 2, 1, True)
    for name, ci, co, k, s in (("3a 3x3", 96, 128, 3, 28), ("3a 5x5", 16, 32, 5, 28),
                               ("4a 3x3", 96, 208, 3, 14), ("4a 5x5", 16, 48, 5, 14),
                               ("5b 3x3", 192, 384, 3, 7), ("5b 5x5", 48, 128, 5, 7))
]


def _products(layer, bottom, top, prop):
    """The timed products: forward (the layer's), and conv_backward's weight and bottom diffs alone."""
    w, wd = layer.blobs[0].data, layer.blobs[0].diff
    im = bottom.data
    dout = top.diff.reshape(top.shape[0], top.shape[1], -1)
    out = [("fwd", lambda: layer.Forward([bottom], [top])),
           ("wgt", lambda: layer.conv_backward(np, dout, w, im, weight_diff=wd))]
    if prop:
        out.append(("data", lambda: layer.conv_backward(np, dout, w, im, im_diff=bottom.diff)))
    return out


def _set_mode(mode):
    """"off", "on" or "auto" (conv_cpu.DENSE), or "avx2" / "avx512": "on" with the kernels' AVX2 or AVX-512
    variant (the others: the variant the kernel module chose at import)."""
    if mode in ("avx2", "avx512"):
        conv_cpu._cd.AVX512 = mode == "avx512"
        mode = "on"
    else:
        conv_cpu._cd.AVX512 = _DEFAULT_AVX512
    conv_cpu.DENSE = mode


_DEFAULT_AVX512 = conv_cpu._cd is not None and conv_cpu._cd.AVX512


def run(families, repeats, warmup, clock, modes=("off", "on")):
    rng = np.random.default_rng(0)
    print(f"{'layer':30s} {'fwd off':>7s} {'on':>6s} {'wgt off':>7s} {'on':>6s} {'data off':>8s} {'on':>6s} | "
          f"{'fwd':>5s} {'wgt':>5s} {'data':>5s} {'all':>5s} | GFLOP/s off/on fwd wgt data | auto")
    for family, name, shape, co, k, pad, group, prop in CASES:
        if families and family not in families:
            continue
        layer = make_layer("Convolution", _conv(co, k, pad, group), name=name)
        bottom, top = Blob(shape), Blob()
        bottom.data[...] = rng.standard_normal(shape, dtype=np.float32)
        layer.SetUp([bottom], [top])
        top.diff[...] = rng.standard_normal(top.shape, dtype=np.float32)
        products = _products(layer, bottom, top, prop)
        times = {(m, p): [] for m in modes for p, _ in products}
        for it in range(warmup + repeats):
            for m in (modes if it % 2 == 0 else modes[::-1]):
                _set_mode(m)
                for p, fn in products:
                    t0 = clock()
                    fn()
                    if it >= warmup:
                        times[(m, p)].append(clock() - t0)
        _set_mode("auto")
        plan = ",".join(p for p in conv_cpu.dense_products(layer, np.float32)) or layer.plan(np, np.float32)
        med = {key: statistics.median(ts) * 1e3 for key, ts in times.items()}
        fl = 2.0 * shape[0] * co * layer.geom.col_count * layer.kernel_dim
        cols, ratios, rates = [], [], []
        a, b = modes
        for p in ("fwd", "wgt", "data"):
            if (a, p) in med:
                cols.append(f"{med[(a, p)]:7.2f} {med[(b, p)]:6.2f}")
                ratios.append(f"{med[(b, p)] / med[(a, p)]:5.2f}")
                rates.append(f"{fl / med[(a, p)] / 1e6:3.0f}/{fl / med[(b, p)] / 1e6:3.0f}")
            else:
                cols.append(f"{'-':>7s} {'-':>6s}")
                ratios.append(f"{'-':>5s}")
                rates.append("   -   ")
        tot = {m: sum(v for (mm, _), v in med.items() if mm == m) for m in modes}
        print(f"{name:30s} {cols[0]} {cols[1]} {cols[2]:>15s} | {' '.join(ratios)} {tot[b] / tot[a]:5.2f} | "
              f"{' '.join(rates)} | {plan}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="", help="families: cifar,lenet,caffenet,resnet,googlenet")
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--modes", default="off,on",
                    help="the two plans compared (\"off\" and \"on\" columns): off, on, auto, avx2 or avx512 "
                         "(\"on\" with that variant of the dense kernels)")
    args = ap.parse_args(argv)
    context.set_mode_cpu()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {os.getloadavg()[0]:.2f}  dense kernels "
          f"{'supported' if conv_cpu._DENSE_SUPPORTED else 'NOT supported'}  median of {args.repeats}")
    modes = tuple(args.modes.split(","))
    if len(modes) != 2:
        ap.error("--modes takes two plans")
    if "avx512" in modes and not conv_cpu._cd.avx512_supported():
        ap.error("this CPU has no AVX-512F")
    print(f"# modes: {modes[0]} (\"off\" columns) vs {modes[1]} (\"on\" columns); dense kernels' default "
          f"variant: {'AVX-512' if _DEFAULT_AVX512 else 'AVX2'}")
    run(set(f for f in args.only.split(",") if f), args.repeats, args.warmup,
        time.process_time if args.cpu_time else time.perf_counter, modes)


if __name__ == "__main__":
    main()
