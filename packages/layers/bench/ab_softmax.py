"""The softmax kernels of another build ("old") against this checkout's ("new"), interleaved in one process,
beside the floors: a copy of the data and bare exp passes over it.

Usage:  python packages/layers/bench/ab_softmax.py OLD_KERNELS_DIR [--repeats 41] [--only resnet,fwd]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_softmax.py OLD_KERNELS_DIR
        python packages/layers/bench/ab_softmax.py --builds avx2,avx512   # two builds of this checkout

OLD_KERNELS_DIR holds another build's softmax_avx2 (and softmax) .so, e.g. the kernels folder of an older
worktree. Cases: Softmax forward / backward and SoftmaxWithLoss forward / backward on the raw kernels at the
ResNet res2 (8x256x56x56), MobileNet conv2 (8x64x112x112) and a segmentation shape (8x21x64x64, under the
streaming threshold), ImageNet classes (64x1000, inner 1) and float64 at the MobileNet shape. Each case first
checks that both builds give the same bits, then runs old and new alternately (order flipped every repetition)
and prints the medians of the wall clock and of the process CPU time (all threads: the work done, less
disturbed by other processes than the wall clock), and the 10th percentile of the wall clock (the runs no other
process interrupted, on a shared machine). The floors, timed the same way on the 8x256x56x56 data:
np.copyto (one read + one write: the memory-bound ideal of bench_layers.py --memory), the elementwise kernel's
Exp (libmvec's AVX2 expf on 2 threads, reading x and writing y in main memory), and the softmax kernels' own
float32 exp (FMA polynomial) on one thread over a 32 KB block that stays in L1 (pure compute, per element).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ab_kernels import pair, same_bits  # (this folder: the script's own, first on sys.path)


SHAPES = [("resnet 8x256x56x56", (8, 256, 3136), np.float32), ("mobilenet 8x64x112x112", (8, 64, 12544), np.float32),
          ("segmentation 8x21x64x64", (8, 21, 4096), np.float32), ("imagenet 64x1000", (64, 1000, 1), np.float32),
          ("mobilenet float64", (8, 64, 12544), np.float64)]


def cases():
    rng = np.random.default_rng(0)
    out = []
    for name, (N, C, S), dt in SHAPES:
        n = N * C * S
        x = (rng.standard_normal(n) * 3).astype(dt)
        dy = rng.standard_normal(n).astype(dt)
        y, dx = np.empty_like(x), np.empty_like(x)
        lab = rng.integers(0, C, N * S).astype(np.int64)
        val = (rng.random(N * S) > 0.1).astype(np.uint8)
        yf = np.empty_like(x)
        out += [
            (f"{name} Softmax fwd", lambda k, x=x, y=y, N=N, C=C, S=S: k.softmax_forward(x, y, N, C, S), (y,), yf,
             (x, N, C, S)),
            (f"{name} Softmax bwd", lambda k, yf=yf, dy=dy, dx=dx, N=N, C=C, S=S: k.softmax_backward(yf, dy, dx, N, C, S),
             (dx,), None, None),
            (f"{name} SoftmaxWithLoss fwd",
             lambda k, x=x, y=y, lab=lab, val=val, N=N, C=C, S=S: k.softmax_loss_forward(x, y, lab, val, N, C, S),
             (y,), None, None),
            (f"{name} SoftmaxWithLoss bwd",
             lambda k, yf=yf, lab=lab, val=val, dx=dx, N=N, C=C, S=S:
             k.softmax_loss_backward(yf, lab, val, dx, N, C, S, 0.5), (dx,), None, None),
        ]
    return out


def old_kernel_labels(layer):
    """The label handling before loss_labels (read_labels' NumPy conversion, two contiguous copies, and the
    VALID count by valid.sum()), for the layers' A/B: the old kernels module and this stand in for the old
    code path."""
    from caffe.layers.softmax_loss import read_labels

    def labels(bottom):
        _, valid, safe = read_labels(layer, np, bottom[1], (layer.outer_num, layer.inner_num), layer.num_classes,
                                     layer.ignore_label)
        lab = np.ascontiguousarray(safe, np.int64).reshape(-1)
        return lab, np.ascontiguousarray(valid).reshape(-1).view(np.uint8), int(valid.sum())
    return labels


def layer_runs(old):
    """(name, run(k)) for the Softmax and SoftmaxWithLoss layers' Forward and Backward at the bench shapes; k = 0
    runs the old path (old kernels module, old label handling), 1 this checkout's."""
    from caffe.blob import Blob
    from caffe.layers import _cpu
    from caffe.layers.testing import make_layer
    rng = np.random.default_rng(2)
    out = []
    for name, shape in (("resnet 8x256x56x56", (8, 256, 56, 56)), ("mobilenet 8x64x112x112", (8, 64, 112, 112))):
        for type_ in ("Softmax", "SoftmaxWithLoss"):
            x = Blob(shape)
            x.data[...] = rng.standard_normal(shape, dtype=np.float32)
            bottom = [x]
            if type_ == "SoftmaxWithLoss":
                lab = Blob((shape[0],) + shape[2:])
                lab.data[...] = rng.integers(0, shape[1], lab.shape)
                bottom.append(lab)
            # one layer and one set of blobs for both paths (placement in memory moved these figures by up to 2x)
            layer, top = make_layer(type_), [Blob()]
            layer.SetUp(bottom, top)
            top[0].diff[...] = rng.standard_normal(top[0].shape, dtype=np.float32)
            prop = [True, False][:len(bottom)]
            old_labels = old_kernel_labels(layer) if type_ == "SoftmaxWithLoss" else None

            def path(k, step, layer=layer, top=top, bottom=bottom, prop=prop, old_labels=old_labels):
                mod = _cpu.softmax
                if k == 0:
                    _cpu.softmax = old
                    if old_labels is not None:
                        layer._kernel_labels = old_labels
                try:
                    if step == "fwd":
                        layer.Forward(bottom, top)
                    else:
                        layer.Backward(top, prop, bottom)
                finally:
                    _cpu.softmax = mod
                    layer.__dict__.pop("_kernel_labels", None)

            def fwd(k, path=path):
                path(k, "fwd")

            def bwd(k, path=path):
                path(k, "bwd")
            out += [(f"layer {name} {type_} Forward", fwd), (f"layer {name} {type_} Backward", bwd)]
    return out


def compare(run, old, new, outs) -> str:
    """same_bits, and where only the returned value (SoftmaxWithLoss's loss) differs, by how much: the vector
    builds' loss takes its logs by libmvec's logf since session 12 (the probabilities keep their bits)."""
    if same_bits(run, old, new, outs):
        return "same bits"
    ret_old = run(old)
    want = [np.array(o, copy=True) for o in outs]
    ret_new = run(new)
    if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, outs)):
        return "OUTPUTS DIFFER"
    return f"same outputs, returned value rel {abs(ret_new - ret_old) / max(abs(ret_old), 1e-300):.1e}"


def low(times):
    """The 10th percentile in ms: on a machine that other work shares, the runs that were not interrupted."""
    t = sorted(times)
    return t[(len(t) - 1) // 10] * 1e3


def timed(fn, clocks):
    t = [c() for c in clocks]
    fn()
    return [c() - t0 for c, t0 in zip(clocks, t)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--builds", default="", help="OLD,NEW: two builds of this checkout's softmax instead (base, avx2, "
                    "avx512: e.g. avx2,avx512)")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--only", default="", help="comma-separated substrings: a case runs when its name has all")
    ap.add_argument("--layers", action="store_true", help="also the layers' Forward / Backward (bench_memory's "
                    "shapes), old kernels + the old label handling against this checkout")
    args = ap.parse_args(argv)
    from caffe.layers import _cpu
    builds = [b.strip() for b in args.builds.split(",")] if args.builds else None
    if (builds is None and not args.old) or (builds is not None and len(builds) != 2):
        ap.error("give OLD_KERNELS_DIR or --builds OLD,NEW")
    mods = pair(_cpu.softmax.__name__.split(".")[-1], args.old, builds)
    if mods is None:
        ap.error(f"--builds {args.builds}: not built here")
    old, new = mods
    clocks = (time.perf_counter, time.process_time)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  {new.__name__}  ms: wall / process CPU, "
          f"median of {args.repeats}")

    # floors on the 8x256x56x56 float32 data
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(8 * 256 * 3136) * 3).astype(np.float32)
    y = np.empty_like(x)
    e0 = np.empty(0, np.float32)
    xl1, yl1 = -np.abs(x[:8192]), np.empty(8192, np.float32)
    reps_l1 = x.size // xl1.size
    floors = [("np.copyto (1 read + 1 write)", lambda: np.copyto(y, x)),
              ("bare exp pass, libmvec, 2 threads", lambda: _cpu.elementwise.neuron_forward(
                  _cpu.EXP, x, y, e0, e0, 1.0, 1.0, 0.0)),
              ("bare exp, FMA poly, 1 thread, in L1", lambda: [new.exp_nonpositive(xl1, yl1) for _ in range(reps_l1)])]
    for name, fn in floors:
        got = [timed(fn, clocks) for _ in range(args.repeats)]
        w, c = [statistics.median(g[i] for g in got) * 1e3 for i in (0, 1)]
        print(f"  {name:44s} {w:7.2f} / {c:6.2f}   (6.42M float32)")

    want = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    for name, run, outs, fill, fill_args in cases():
        if fill is not None:
            xx, N, C, S = fill_args
            new.softmax_forward(xx, fill, N, C, S)
        if want and not all(w in name.lower() for w in want):
            continue
        same = compare(run, old, new, outs)
        got = {0: [], 1: []}
        for i in range(args.repeats + 2):
            for k in ((0, 1) if i % 2 else (1, 0)):
                t = timed(lambda: run((old, new)[k]), clocks)
                if i >= 2:
                    got[k].append(t)
        (ow, oc), (nw, nc) = [[statistics.median(g[i] for g in got[k]) * 1e3 for i in (0, 1)] for k in (0, 1)]
        ol, nl = [low(g[0] for g in got[k]) for k in (0, 1)]
        print(f"  {name:44s} old {ow:7.2f} / {oc:6.2f}   new {nw:7.2f} / {nc:6.2f}   old/new wall {ow / nw:5.2f} "
              f"cpu {oc / nc:5.2f}  p10 wall {ol:6.2f} / {nl:6.2f}  "
              f"{same}", flush=True)
    if not args.layers:
        return
    for name, run in layer_runs(old):
        if want and not all(w in name.lower() for w in want):
            continue
        got = {0: [], 1: []}
        for i in range(args.repeats + 2):
            for k in ((0, 1) if i % 2 else (1, 0)):
                t = timed(lambda: run(k), clocks)
                if i >= 2:
                    got[k].append(t)
        (ow, oc), (nw, nc) = [[statistics.median(g[i] for g in got[k]) * 1e3 for i in (0, 1)] for k in (0, 1)]
        ol, nl = [low(g[0] for g in got[k]) for k in (0, 1)]
        print(f"  {name:52s} old {ow:7.2f} / {oc:6.2f}   new {nw:7.2f} / {nc:6.2f}   old/new wall {ow / nw:5.2f} "
              f"cpu {oc / nc:5.2f}  p10 wall {ol:6.2f} / {nl:6.2f}", flush=True)


if __name__ == "__main__":
    main()
