"""Time forward + backward of the vision layers at the shapes of LeNet, CIFAR10-quick and CaffeNet.

Usage:  python packages/layers/bench/bench_layers.py [--repeats N] [--nets lenet,cifar10_quick,caffenet]
                                                     [--threads N]
        python packages/layers/bench/bench_layers.py --memory [--compare-xp] [--only BatchNorm,Scale]
                                                     [--shapes resnet,mobilenet] [--malloc-default]

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
    args = ap.parse_args(argv)
    context.set_mode_cpu()
    if args.memory:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_memory
        bench_memory.run(args.shapes.split(","), [o for o in args.only.split(",") if o], args.repeats,
                         args.warmup, args.compare_xp, args.malloc_default)
        return
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    threads += f" (OPENBLAS_THREAD_TIMEOUT {os.environ.get('OPENBLAS_THREAD_TIMEOUT') or 'unset'})"
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.machine()}  {os.cpu_count()} CPUs  "
          f"threads {threads}  load avg {os.getloadavg()[0]:.2f}  numpy {np.__version__}  float32  "
          f"median of {args.repeats} runs after {args.warmup} warm-up")
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
