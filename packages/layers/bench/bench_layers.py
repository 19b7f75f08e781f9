"""Time forward + backward of the vision layers at the shapes of LeNet, CIFAR10-quick and CaffeNet.

Usage:  python packages/layers/bench/bench_layers.py [--repeats N] [--nets lenet,cifar10_quick,caffenet]
                                                     [--threads N]
        python packages/layers/bench/bench_layers.py --memory [--compare-xp] [--only BatchNorm,Scale]
                                                     [--shapes resnet,mobilenet] [--malloc-default]
        python packages/layers/bench/bench_layers.py --conv [--repeats N] [--cases cifar,mobilenet,...]

--memory times the memory-bound layers instead (bench_memory.py: BatchNorm, Scale, Bias,
Eltwise, the neuron layers, Dropout, Softmax, LRN, Concat/Slice/Split, Pooling) at ResNet-50 /
MobileNet batch-8 shapes, beside a np.copyto bandwidth figure and the time one read of the
inputs and one write of the outputs would take at that bandwidth; --compare-xp also times
the array-module-generic NumPy path (the GPU path's code, and the CPU path before the
kernels) of the same layer, interleaved with the CPU path.

Each layer runs alone on float32 blobs of its real shape (random data, random top
diff), first a few warm-up iterations (scratch buffers get allocated then), then
`repeats` timed forward+backward iterations; the median is printed, per layer
and summed per net (and the fastest run, a hint of what a quiet machine does).
--threads sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS (before NumPy loads). The first convolution of each net does not propagate to its
bottom (the data), as in a real net. Activations, dropout and losses are not
part of these layers, so they are not timed.

--conv times single convolution layers (CONV_CASES: CIFAR10-quick, LeNet, MobileNet v1
depthwise and pointwise, ResNet-50 1x1, CaffeNet conv2) with the CPU plans (conv_base
.CPU_PATHS = True) and with the generic batched path they replaced (False), interleaved
in one process, and prints medians in ms and GFLOP/s for forward and backward.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time


def _threads_from_argv(argv):
    # Thread pools read their size when NumPy / the kernels load: set it before importing them.
    for i, a in enumerate(argv):
        if a.startswith("--threads"):
            value = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            if value:
                os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = value


_threads_from_argv(sys.argv[1:])
# OpenBLAS's idle threads spin for ~0.1 s after each GEMM and steal the second core from the
# OpenMP kernels (im2col, pooling) that run between GEMMs; 2^4 cycles makes them sleep at once.
# OpenBLAS reads this when NumPy loads, so it must be set before: see README.md.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

from caffe.blob import Blob, context  # noqa: E402
from caffe.layers.testing import make_layer  # noqa: E402

FILL = "weight_filler { type: 'gaussian' std: 0.01 } bias_filler { type: 'constant' value: 0.1 }"


def conv(num_output, kernel, stride=1, pad=0, group=1):
    return ("Convolution", f"convolution_param {{ num_output: {num_output} kernel_size: {kernel} "
                           f"stride: {stride} pad: {pad} group: {group} {FILL} }}")


def pool(method, kernel, stride):
    return ("Pooling", f"pooling_param {{ pool: {method} kernel_size: {kernel} stride: {stride} }}")


def ip(num_output):
    return ("InnerProduct", f"inner_product_param {{ num_output: {num_output} {FILL} }}")


def lrn(size):
    return ("LRN", f"lrn_param {{ local_size: {size} alpha: 0.0001 beta: 0.75 }}")


NETS = {
    "lenet": ((64, 1, 28, 28), [
        ("conv1", conv(20, 5)), ("pool1", pool("MAX", 2, 2)), ("conv2", conv(50, 5)),
        ("pool2", pool("MAX", 2, 2)), ("ip1", ip(500)), ("ip2", ip(10))]),
    "cifar10_quick": ((100, 3, 32, 32), [
        ("conv1", conv(32, 5, pad=2)), ("pool1", pool("MAX", 3, 2)), ("conv2", conv(32, 5, pad=2)),
        ("pool2", pool("AVE", 3, 2)), ("conv3", conv(64, 5, pad=2)), ("pool3", pool("AVE", 3, 2)),
        ("ip1", ip(64)), ("ip2", ip(10))]),
    "caffenet": ((8, 3, 227, 227), [
        ("conv1", conv(96, 11, stride=4)), ("pool1", pool("MAX", 3, 2)), ("norm1", lrn(5)),
        ("conv2", conv(256, 5, pad=2, group=2)), ("pool2", pool("MAX", 3, 2)), ("norm2", lrn(5)),
        ("conv3", conv(384, 3, pad=1)), ("conv4", conv(384, 3, pad=1, group=2)),
        ("conv5", conv(256, 3, pad=1, group=2)), ("pool5", pool("MAX", 3, 2)),
        ("fc6", ip(4096)), ("fc7", ip(4096)), ("fc8", ip(1000))]),
}


# -- convolution: the CPU plans against the generic batched path ------------------------------

def _dwconv(n, k, stride=1, pad=1, group=1, bias=False):
    return (f"convolution_param {{ num_output: {n} kernel_size: {k} stride: {stride} pad: {pad} group: {group} "
            f"bias_term: {str(bias).lower()} {FILL} }}")


# (family, layer, bottom shape, convolution_param text, propagate to the bottom)
CONV_CASES = [
    ("cifar", "cifar10_quick conv1", (100, 3, 32, 32), _dwconv(32, 5, pad=2, bias=True), False),
    ("cifar", "cifar10_quick conv2", (100, 32, 16, 16), _dwconv(32, 5, pad=2, bias=True), True),
    ("cifar", "cifar10_quick conv3", (100, 32, 8, 8), _dwconv(64, 5, pad=2, bias=True), True),
    ("lenet", "lenet conv1", (64, 1, 28, 28), _dwconv(20, 5, pad=0, bias=True), False),
    ("lenet", "lenet conv2", (64, 20, 12, 12), _dwconv(50, 5, pad=0, bias=True), True),
    ("caffenet", "caffenet conv2 b8", (8, 96, 27, 27), _dwconv(256, 5, pad=2, group=2, bias=True), True),
] + [
    ("mobilenet", f"mobilenet dw {c}x{s}x{s} s{st} b{b}", (b, c, s, s), _dwconv(c, 3, st, 1, group=c), True)
    for b in (1, 8) for c, s, st in ((32, 112, 1), (64, 112, 2), (128, 56, 1), (256, 28, 1), (512, 14, 1),
                                     (512, 14, 2), (1024, 7, 1))
] + [
    ("mobilenet", f"mobilenet pw {ci}->{co} {s}x{s} b8", (8, ci, s, s), _dwconv(co, 1, pad=0), True)
    for ci, co, s in ((32, 64, 112), (256, 256, 28), (1024, 1024, 7))
] + [
    ("resnet", f"resnet50 1x1 {ci}->{co} {s}x{s} b8", (8, ci, s, s), _dwconv(co, 1, pad=0), True)
    for ci, co, s in ((64, 64, 56), (256, 64, 56), (64, 256, 56), (1024, 256, 14), (256, 1024, 14),
                      (2048, 512, 7), (512, 2048, 7))
] + [
    ("resnet", "resnet50 3x3 128x28x28 b8", (8, 128, 28, 28), _dwconv(128, 3, pad=1), True),
]


def _conv_flops(layer, bottom_shape):
    n = bottom_shape[0]
    return 2.0 * n * layer.num_output * layer.geom.col_count * layer.kernel_dim


def bench_conv(families, repeats, warmup, clock=time.perf_counter):
    from caffe.layers import conv_base
    rng = np.random.default_rng(0)
    modes = (("old", False), ("new", True))
    print(f"\n{'layer':40s} {'plan':8s} {'old fwd':>8s} {'new fwd':>8s} {'old bwd':>8s} {'new bwd':>8s} "
          f"{'speedup':>7s} | GFLOP/s {'fwd old':>7s} {'new':>6s} {'bwd old':>7s} {'new':>6s}")
    for family, name, shape, text, prop in CONV_CASES:
        if family not in families:
            continue
        layer = make_layer("Convolution", text, name=name)
        bottom, top = Blob(shape), Blob()
        bottom.data[...] = rng.standard_normal(shape, dtype=np.float32)
        layer.SetUp([bottom], [top])
        top.diff[...] = rng.standard_normal(top.shape, dtype=np.float32)
        times = {m: ([], []) for m, _ in modes}
        for it in range(warmup + repeats):
            for m, flag in (modes if it % 2 == 0 else modes[::-1]):
                conv_base.CPU_PATHS = flag
                t0 = clock()
                layer.Forward([bottom], [top])
                t1 = clock()
                layer.Backward([top], [prop], [bottom])
                t2 = clock()
                if it >= warmup:
                    times[m][0].append(t1 - t0)
                    times[m][1].append(t2 - t1)
        conv_base.CPU_PATHS = True
        med = {m: [statistics.median(ts) * 1e3 for ts in times[m]] for m, _ in modes}
        fl = _conv_flops(layer, shape)
        fl_b = fl * (2 if prop else 1)
        speed = (med["old"][0] + med["old"][1]) / (med["new"][0] + med["new"][1])
        print(f"{name:40s} {layer.plan(np, np.float32):8s} {med['old'][0]:8.2f} {med['new'][0]:8.2f} "
              f"{med['old'][1]:8.2f} {med['new'][1]:8.2f} {speed:6.2f}x | {'':7s} "
              f"{fl / med['old'][0] / 1e6:7.1f} {fl / med['new'][0] / 1e6:6.1f} "
              f"{fl_b / med['old'][1] / 1e6:7.1f} {fl_b / med['new'][1] / 1e6:6.1f}", flush=True)


def bench_net(name, repeats, warmup):
    shape, layers = NETS[name]
    rng = np.random.default_rng(0)
    bottom = Blob(shape)
    bottom.data[...] = rng.standard_normal(shape, dtype=np.float32)
    rows = []
    for i, (lname, (ltype, text)) in enumerate(layers):
        layer = make_layer(ltype, text, name=lname)
        top = Blob()
        layer.SetUp([bottom], [top])
        layer.Forward([bottom], [top])
        top.diff[...] = rng.standard_normal(top.shape, dtype=np.float32)
        prop = [i > 0]
        times = []
        for it in range(warmup + repeats):
            t0 = time.perf_counter()
            layer.Forward([bottom], [top])
            t1 = time.perf_counter()
            layer.Backward([top], prop, [bottom])
            t2 = time.perf_counter()
            if it >= warmup:
                times.append((t1 - t0, t2 - t1))
        fwd = statistics.median(t[0] for t in times) * 1e3
        bwd = statistics.median(t[1] for t in times) * 1e3
        tot = statistics.median(t[0] + t[1] for t in times) * 1e3
        best = min(t[0] + t[1] for t in times) * 1e3
        rows.append((lname, ltype, bottom.shape, top.shape, fwd, bwd, tot, best))
        nxt = Blob(top.shape)
        nxt.data[...] = top.data
        bottom = nxt
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--nets", default="lenet,cifar10_quick,caffenet")
    ap.add_argument("--threads", type=int, default=None,
                    help="OpenBLAS / OpenMP threads (default: the libraries' own, all cores)")
    ap.add_argument("--memory", action="store_true", help="time the memory-bound layers (see bench_memory.py)")
    ap.add_argument("--compare-xp", action="store_true",
                    help="with --memory: also time the generic NumPy path, interleaved")
    ap.add_argument("--only", default="", help="with --memory: comma-separated layer types or case names")
    ap.add_argument("--shapes", default="resnet,mobilenet", help="with --memory: resnet, mobilenet")
    ap.add_argument("--malloc-default", action="store_true",
                    help="with --memory: leave glibc's adaptive mmap threshold alone (see bench_memory.py)")
    ap.add_argument("--floor", action="store_true",
                    help="with --memory: also time each layer on a cache-resident blob, scaled to the full count "
                         "(what it costs when memory does not limit it; see bench_memory.py)")
    ap.add_argument("--conv", action="store_true",
                    help="time the convolution cases (CONV_CASES) old vs new instead of the nets")
    ap.add_argument("--cases", default="cifar,lenet,caffenet,mobilenet,resnet",
                    help="with --conv: the families of CONV_CASES to run")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --conv: time by the process's CPU time (all threads), not the wall clock: "
                         "the work done, less disturbed by other processes on a shared machine")
    args = ap.parse_args(argv)
    context.set_mode_cpu()
    if args.memory:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_memory
        bench_memory.run(args.shapes.split(","), [o for o in args.only.split(",") if o], args.repeats,
                         args.warmup, args.compare_xp, args.malloc_default, args.floor)
        return
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    threads += f" (OPENBLAS_THREAD_TIMEOUT {os.environ.get('OPENBLAS_THREAD_TIMEOUT') or 'unset'})"
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.machine()}  {os.cpu_count()} CPUs  "
          f"threads {threads}  load avg {os.getloadavg()[0]:.2f}  numpy {np.__version__}  float32  "
          f"median of {args.repeats} runs after {args.warmup} warm-up")
    if args.conv:
        bench_conv(set(args.cases.split(",")), args.repeats, args.warmup,
                   time.process_time if args.cpu_time else time.perf_counter)
        return
    for name in args.nets.split(","):
        rows = bench_net(name, args.repeats, args.warmup)
        print(f"\n{name}  (batch {NETS[name][0][0]})")
        print(f"  {'layer':8s} {'type':13s} {'bottom':>18s} -> {'top':18s} {'fwd ms':>8s} {'bwd ms':>8s} "
              f"{'fwd+bwd':>8s} {'(best)':>8s}")
        for lname, ltype, bs, ts, f, b, t, best in rows:
            print(f"  {lname:8s} {ltype:13s} {str(bs):>18s} -> {str(ts):18s} {f:8.2f} {b:8.2f} {t:8.2f} "
                  f"{best:8.2f}")
        print(f"  {'sum':8s} {'':13s} {'':>18s}    {'':18s} {sum(r[4] for r in rows):8.2f} "
              f"{sum(r[5] for r in rows):8.2f} {sum(r[6] for r in rows):8.2f} {sum(r[7] for r in rows):8.2f}")


if __name__ == "__main__":
    main()
