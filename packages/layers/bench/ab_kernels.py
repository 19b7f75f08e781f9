"""Another build's memory-bound kernels ("old") against this checkout's ("new"), interleaved in one process.

Usage:  python packages/layers/bench/ab_kernels.py OLD_KERNELS_DIR [--repeats 25]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_kernels.py OLD_KERNELS_DIR   # per-thread CPU time
        python packages/layers/bench/ab_kernels.py --builds avx2,avx512    # two builds of this checkout

OLD_KERNELS_DIR holds the compiled kernels of another checkout, e.g. a worktree of an older commit
installed with scripts/install.sh: ../before/packages/layers/src/caffe/layers/kernels. The raw kernels
(the AVX2 builds of pooling, normalization, softmax, elementwise) run at the ResNet res2 shape
8x256x56x56 float32 (global AVE pooling: 8x2048x7x7), old and new alternating, median of --repeats,
beside a np.copyto of the bottom (one read and one write of 25.7 MB), and the neuron layers that call libm
(Sigmoid, TanH, ELU, Exp, Log, BNLL, Swish) forward and backward; then MAX pooling and LRN at the
shapes of CaffeNet, SqueezeNet 1.1 and GoogLeNet (batch 8). Each case first runs both
builds once on the same inputs and says whether their outputs (and returned value) are the same
bits. With OMP_NUM_THREADS=1 the figures are the thread's CPU time, far less disturbed by other
processes than two threads' wall clock. --only picks cases by substrings of their names.
Whole layers against the memory bandwidth: bench_layers.py --memory.
"""
from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import os
import statistics
import time

import numpy as np

N, C, H, W = 8, 256, 56, 56
S, PH, PW = H * W, 28, 28
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def _base(name):
    """The family of a kernels module name: elementwise_avx2 -> elementwise."""
    for suffix in ("_avx2", "_avx512"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def build_pair(name, builds):
    """Two builds (base, avx2, avx512) of this checkout's kernel family `name`: (old, new), or None where one is
    not built."""
    mods = []
    for b in builds:
        try:
            mods.append(importlib.import_module(f"caffe.layers.kernels.{_base(name)}{'' if b == 'base' else '_' + b}"))
        except ImportError:
            return None
    return tuple(mods)


def pair(name, old_dir, builds=None):
    """(old, new): old_dir's build of the kernels module `name` and this checkout's; with builds (two of base,
    avx2, avx512), those two builds of this checkout's family instead (None where one is not built)."""
    if builds:
        return build_pair(name, builds)
    # This checkout's module first: a Cython module registers itself under its name when it loads, so the
    # old one (from its file, under the same name) must come second.
    new = importlib.import_module(f"caffe.layers.kernels.{name}")
    paths = glob.glob(os.path.join(old_dir, f"{name}.cpython-*.so"))
    if not paths:
        raise SystemExit(f"no {name} build in {old_dir}")
    spec = importlib.util.spec_from_file_location(f"caffe.layers.kernels.{name}", paths[0])
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    assert old is not new and old.__file__ != new.__file__
    return old, new


def family_pairs(family, old_dir, builds):
    """(build, old, new) for each of builds (base, avx2, avx512) of the kernels module family, after a header
    line (time, load, threads); a build this CPU cannot run is said and skipped."""
    from caffe.layers import _cpu
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  ms: wall / process CPU, old and new "
          "alternating")
    for build in builds:
        if build == "avx512" and not _cpu.cpu_has_avx512():
            print(f"  {build}: skipped (no AVX-512 here)")
            continue
        yield (build, *pair(family if build == "base" else f"{family}_{build}", old_dir))


def same_bits(run, old, new, outs) -> bool:
    """Run both builds once on the same inputs: whether their outputs (and returned values) are the same bits."""
    ret_old = run(old)
    want = [np.array(o, copy=True) for o in outs]
    ret_new = run(new)
    return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, outs)) and (
        ret_old == ret_new or (ret_old != ret_old and ret_new != ret_new))


def cases(old_dir, builds=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N * C * S).astype(np.float32)
    dy = rng.standard_normal(x.size).astype(np.float32)
    y, dx, sc, e = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty(0, np.float32)
    xn = np.empty_like(x)
    e64, emk = np.empty(0), np.empty(x.size, np.int32)
    yp, mk = np.empty(N * C * PH * PW, np.float32), np.empty(N * C * PH * PW, np.int32)
    dyp = rng.standard_normal(yp.size).astype(np.float32)
    g, gy = rng.standard_normal(8 * 2048 * 49).astype(np.float32), np.empty(8 * 2048, np.float32)
    m, v, mask = np.zeros(C), np.zeros(C), np.empty(x.size, np.uint8)
    lab, val = rng.integers(0, C, N * S).astype(np.int64), np.ones(N * S, np.uint8)
    pool, norm, soft, elt = (pair(n, old_dir, builds) for n in ("pooling_avx2", "normalization_avx2", "softmax_avx2",
                                                                 "elementwise_avx2"))
    # (--builds: families without the two builds, pooling and normalization under avx512, are left out; their
    # setup runs on the checkout's AVX2 / baseline build)
    new_norm = norm[1] if norm else importlib.import_module("caffe.layers.kernels.normalization")
    new_soft = soft[1] if soft else importlib.import_module("caffe.layers.kernels.softmax")
    new_norm.batch_norm_train_forward(x, y, e, m, v, N, C, S, 1e-5)
    mf, inv = m.astype(np.float32), (1 / np.sqrt(v + 1e-5)).astype(np.float32)
    sy, ly = np.empty_like(x), np.empty_like(x)
    new_soft.softmax_forward(x, sy, N, C, S)
    new_norm.lrn_across_forward(x, ly, sc, N, C, S, 5, 1e-4, 1.0, 0.75)
    importlib.import_module("caffe.layers.kernels.pooling").max_pool_forward(x, yp, mk, N * C, H, W, PH, PW, 3, 3,
                                                                              2, 2, 0, 0)
    # the neuron layers whose kernels call libm (forward, then backward from the forward's top), x ~ 3 N(0, 1)
    x3, ny, naux = x * 3, np.empty_like(x), np.empty_like(x)
    neurons = [("Sigmoid", 1, 0, 0, 0, 0), ("TanH", 2, 0, 0, 0, 0), ("ELU", 3, 1.0, 0, 0, 0),
               ("Exp", 5, 1.0, 1.0, 0, 0), ("Log", 6, 1.0, 10.0, 1.0, 1.0), ("BNLL", 8, 0, 0, 0, 0),
               ("Swish", 11, 1.0, 0, 0, 0)]
    elt_new = elt[1] if elt else importlib.import_module("caffe.layers.kernels.elementwise")
    neuron_cases = []
    for nname, op, a, b, c, d in neurons:
        nyf, nauxf = np.empty_like(x), np.empty_like(x)
        elt_new.neuron_forward(op, x3, nyf, nauxf if op == 11 else e, e, a, b, c)
        neuron_cases += [
            (f"{nname} forward", elt, lambda k, op=op, a=a, b=b, c=c: k.neuron_forward(
                op, x3, ny, naux if op == 11 else e, e, a, b, c), (ny,) + ((naux,) if op == 11 else ())),
            (f"{nname} backward", elt, lambda k, op=op, a=a, b=b, c=c, d=d, nyf=nyf, nauxf=nauxf: k.neuron_backward(
                op, x3, nyf, nauxf if op == 11 else e, dy, dx, a, b, c, d), (dx,))]

    def softmax_loss(k):
        # A build whose softmax_loss_forward takes the logits computes the probabilities and the loss at once;
        # before it, the layer ran the softmax kernel and then this NumPy loss.
        try:
            return k.softmax_loss_forward(x, y, lab, val, N, C, S)
        except (AttributeError, TypeError):
            k.softmax_forward(x, y, N, C, S)
            p = np.take_along_axis(y.reshape(N, C, S), lab.reshape(N, 1, S), axis=1)[:, 0, :]
            return -np.where(val.reshape(N, S) != 0, np.log(np.maximum(p, FLT_MIN)), 0).sum()

    return [
        ("Pooling MAX 3/2 forward", pool,
         lambda k: k.max_pool_forward(x, yp, mk, N * C, H, W, PH, PW, 3, 3, 2, 2, 0, 0), (yp, mk)),
        ("Pooling MAX 3/2 fwd values", pool,  # a TEST-phase forward: the values alone
         lambda k: k.max_pool_forward(x, yp, None, N * C, H, W, PH, PW, 3, 3, 2, 2, 0, 0), (yp,)),
        ("Pooling MAX 3/2 backward", pool, lambda k: k.max_pool_backward(dyp, mk, dx, N * C, S, PH * PW), (dx,)),
        ("Pooling AVE global forward", pool,
         lambda k: k.ave_pool_forward(g, gy, 8 * 2048, 7, 7, 1, 1, 7, 7, 1, 1, 0, 0), (gy,)),
        ("BatchNorm train forward", norm, lambda k: k.batch_norm_train_forward(x, y, e, m, v, N, C, S, 1e-5),
         (y, m, v)),
        ("BatchNorm train fwd + x_norm", norm, lambda k: k.batch_norm_train_forward(x, y, xn, m, v, N, C, S, 1e-5),
         (y, xn, m, v)),
        ("BatchNorm train backward", norm, lambda k: k.batch_norm_train_backward(dy, e, x, mf, inv, dx, N, C, S),
         (dx,)),
        ("LRN forward", norm, lambda k: k.lrn_across_forward(x, y, dx, N, C, S, 5, 1e-4, 1.0, 0.75), (y, dx)),
        ("LRN backward", norm, lambda k: k.lrn_across_backward(x, ly, sc, dy, dx, N, C, S, 5, 1e-4, 0.75), (dx,)),
        ("Softmax forward", soft, lambda k: k.softmax_forward(x, y, N, C, S), (y,)),
        ("Softmax backward", soft, lambda k: k.softmax_backward(sy, dy, dx, N, C, S), (dx,)),
        ("SoftmaxWithLoss forward", soft, softmax_loss, (y,)),
        ("Dropout forward", elt, lambda k: k.dropout_forward(x, y, mask, 77, 32768, 2.0), (y, mask)),
        ("Eltwise MAX forward", elt, lambda k: k.eltwise_forward(2, [x, dy], e64, y, emk), (y, emk)),
        ("Eltwise MAX backward", elt, lambda k: k.eltwise_backward(2, [x, dy], [dx, sc], e64, e, dy, emk, False),
         (dx, sc)),
        ("Eltwise SUM forward", elt, lambda k: k.eltwise_forward(1, [x, dy], np.ones(2), y, emk[:0]), (y,)),
        ("Eltwise SUM backward", elt, lambda k: k.eltwise_backward(1, [x, dy], [dx, sc], np.ones(2), e, dy, emk[:0],
                                                                   False), (dx, sc)),
        ("Eltwise PROD backward", elt, lambda k: k.eltwise_backward(0, [x, dy], [dx, sc], e64, e, dy, emk[:0], True),
         (dx, sc)),
    ] + neuron_cases + channelwise_cases(old_dir, builds, rng) + net_shape_cases(pool, norm, rng), x, y


def channelwise_cases(old_dir, builds, rng):
    """Scale+bias, Bias, PReLU, BatchNorm global (kernels.channelwise) forward and backward at the ResNet res2 and
    the MobileNet 8x64x112x112 shapes (the same 25.7 MB; 3136 and 12544 positions per channel)."""
    cw = pair("channelwise", old_dir, builds) if builds is None or "base" in builds or "avx512" in builds else None
    if cw is None:
        return []
    out = []
    e, e64 = np.empty(0, np.float32), np.empty(0)
    for sname, (n, c, s) in (("resnet", (N, C, S)), ("mobilenet", (8, 64, 112 * 112))):
        x = rng.standard_normal(n * c * s).astype(np.float32)
        dy = rng.standard_normal(x.size).astype(np.float32)
        y, dx = np.empty_like(x), np.empty_like(x)
        sc, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        ds, db = np.empty(c), np.empty(c)
        out += [
            (f"Scale+bias forward {sname}", cw, lambda k, x=x, sc=sc, b=b, y=y, n=n, c=c, s=s:
             k.channel_forward(0, x, sc, b, y, e, n, c, s), (y,)),
            (f"Scale+bias backward {sname}", cw, lambda k, dy=dy, x=x, sc=sc, dx=dx, ds=ds, db=db, n=n, c=c, s=s:
             k.channel_backward(0, dy, x, sc, dx, ds, db, n, c, s), (dx, ds, db)),
            (f"Bias backward {sname}", cw, lambda k, dy=dy, db=db, n=n, c=c, s=s:
             k.channel_backward(0, dy, e, e, e, e64, db, n, c, s), (db,)),
            (f"BatchNorm global forward {sname}", cw, lambda k, x=x, sc=sc, b=b, y=y, n=n, c=c, s=s:
             k.channel_forward(2, x, sc, b, y, e, n, c, s), (y,)),
            (f"BatchNorm global backward {sname}", cw, lambda k, dy=dy, sc=sc, dx=dx, n=n, c=c, s=s:
             k.channel_backward(0, dy, e, sc, dx, e64, e64, n, c, s), (dx,)),
            (f"PReLU forward {sname}", cw, lambda k, x=x, sc=sc, y=y, n=n, c=c, s=s:
             k.channel_forward(1, x, sc, e, y, e, n, c, s), (y,)),
            (f"PReLU backward {sname}", cw, lambda k, dy=dy, x=x, sc=sc, dx=dx, ds=ds, n=n, c=c, s=s:
             k.channel_backward(1, dy, x, sc, dx, ds, e64, n, c, s), (dx, ds)),
        ]
    return out


def _pooled(h, k, s, p):
    # Caffe's ceil rounding, the last window starting inside the image (or its top padding)
    o = -(-(h + 2 * p - k) // s) + 1
    return o - 1 if p and (o - 1) * s >= h + p else o


# MAX pooling and LRN at the shapes of the nets (batch 8): CaffeNet / AlexNet, SqueezeNet 1.1, GoogLeNet
NET_POOL = [("CaffeNet pool1", 96, 55, 3, 2, 0), ("CaffeNet pool2", 256, 27, 3, 2, 0),
            ("SqueezeNet pool1", 64, 111, 3, 2, 0), ("GoogLeNet pool1", 64, 112, 3, 2, 0),
            ("GoogLeNet 3x3/1 pad 1", 192, 28, 3, 1, 1)]
NET_LRN = [("CaffeNet norm1", 96, 55), ("CaffeNet norm2", 256, 27), ("GoogLeNet norm2", 192, 56)]


def net_shape_cases(pool, norm, rng):
    out = []
    if not (pool and norm):  # (--builds without those families' builds)
        return out
    for name, c, h, k, s, p in NET_POOL:
        ph = _pooled(h, k, s, p)
        x = rng.standard_normal(8 * c * h * h).astype(np.float32)
        y, mk = np.empty(8 * c * ph * ph, np.float32), np.empty(8 * c * ph * ph, np.int32)
        out.append((f"MAX fwd {name} {c}x{h}", pool,
                    lambda km, x=x, y=y, mk=mk, c=c, h=h, ph=ph, k=k, s=s, p=p:
                    km.max_pool_forward(x, y, mk, 8 * c, h, h, ph, ph, k, k, s, s, p, p), (y, mk)))
        # a TEST-phase forward: the values alone (no argmax)
        out.append((f"MAX fwd values {name} {c}x{h}", pool,
                    lambda km, x=x, y=y, c=c, h=h, ph=ph, k=k, s=s, p=p:
                    km.max_pool_forward(x, y, None, 8 * c, h, h, ph, ph, k, k, s, s, p, p), (y,)))
    for name, c, h in NET_LRN:
        x = rng.standard_normal(8 * c * h * h).astype(np.float32)
        y, sc = np.empty_like(x), np.empty_like(x)
        dyl, dxl = rng.standard_normal(x.size).astype(np.float32), np.empty_like(x)
        norm[1].lrn_across_forward(x, y, sc, 8, c, h * h, 5, 1e-4, 1.0, 0.75)
        yf, scf = y.copy(), sc.copy()
        out.append((f"LRN fwd {name} {c}x{h}", norm,
                    lambda km, x=x, y=y, sc=sc, c=c, h=h: km.lrn_across_forward(x, y, sc, 8, c, h * h, 5, 1e-4, 1.0,
                                                                              0.75), (y, sc)))
        out.append((f"LRN bwd {name} {c}x{h}", norm,
                    lambda km, x=x, yf=yf, scf=scf, dyl=dyl, dxl=dxl, c=c, h=h:
                    km.lrn_across_backward(x, yf, scf, dyl, dxl, 8, c, h * h, 5, 1e-4, 0.75), (dxl,)))
        out.append((f"LRN fwd values {name} {c}x{h}", norm,  # a TEST-phase forward: no scale written
                    lambda km, x=x, y=y, c=c, h=h: km.lrn_across_forward(x, y, None, 8, c, h * h, 5, 1e-4, 1.0,
                                                                       0.75), (y,)))
    # MobileNet's first feature map (bench_layers --memory's "mobilenet" shapes): BatchNorm with batch statistics
    # and LRN at 8x64x112x112
    c, h = 64, 112
    x = rng.standard_normal(8 * c * h * h).astype(np.float32)
    y, xn, dyb, dxb = np.empty_like(x), np.empty_like(x), rng.standard_normal(x.size).astype(np.float32), np.empty_like(x)
    m, v, e = np.zeros(c), np.zeros(c), np.empty(0, np.float32)
    norm[1].batch_norm_train_forward(x, y, e, m, v, 8, c, h * h, 1e-5)
    mf, inv = m.astype(np.float32), (1 / np.sqrt(v + 1e-5)).astype(np.float32)
    out += [
        (f"BatchNorm train fwd MobileNet {c}x{h}", norm,
         lambda km: km.batch_norm_train_forward(x, y, e, m, v, 8, c, h * h, 1e-5), (y, m, v)),
        (f"BatchNorm train bwd MobileNet {c}x{h}", norm,
         lambda km: km.batch_norm_train_backward(dyb, e, x, mf, inv, dxb, 8, c, h * h), (dxb,)),
        (f"LRN fwd MobileNet {c}x{h}", norm,
         lambda km: km.lrn_across_forward(x, y, xn, 8, c, h * h, 5, 1e-4, 1.0, 0.75), (y, xn)),
        (f"LRN fwd values MobileNet {c}x{h}", norm,
         lambda km: km.lrn_across_forward(x, y, None, 8, c, h * h, 5, 1e-4, 1.0, 0.75), (y,))]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--builds", default="", help="OLD,NEW: two builds of this checkout instead (base, avx2, avx512: "
                    "e.g. avx2,avx512); the families without both builds are left out")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--only", default="", help="comma-separated substrings of the case names to run")
    args = ap.parse_args(argv)
    one = os.environ.get("OMP_NUM_THREADS") == "1"
    clk = time.thread_time if one else time.perf_counter
    builds = [b.strip() for b in args.builds.split(",")] if args.builds else None
    if builds is None and not args.old:
        ap.error("give OLD_KERNELS_DIR or --builds OLD,NEW")
    if builds is not None and len(builds) != 2:
        ap.error("--builds takes two builds: OLD,NEW")
    todo, x, y = cases(args.old, builds)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  {'thread CPU time' if one else 'wall'} ms, "
          f"median of {args.repeats}")
    times = []
    for _ in range(args.repeats):
        t0 = clk()
        np.copyto(y, x)
        times.append(clk() - t0)
    print(f"  np.copyto of 25.7 MB: {statistics.median(times) * 1e3:.2f} ms")
    only = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    for name, mods, run, outs in todo:
        if only and not any(w in name.lower() for w in only):
            continue
        if mods is None:
            continue
        old, new = mods
        same = same_bits(run, old, new, outs)
        got = {old: [], new: []}
        for i in range(args.repeats + 2):
            for k in ((old, new) if i % 2 else (new, old)):
                t0 = clk()
                run(k)
                if i >= 2:
                    got[k].append(clk() - t0)
        o, n = (statistics.median(got[k]) * 1e3 for k in (old, new))
        print(f"  {name:38s} old {o:7.2f}  new {n:7.2f}  old / new {o / n:5.2f}  "
              f"{'same bits' if same else 'OUTPUTS DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
