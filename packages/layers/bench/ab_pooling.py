"""Another build's pooling kernels ("old") against this checkout's ("new"), interleaved in one process.

Usage:  python packages/layers/bench/ab_pooling.py [OLD_KERNELS_DIR] [--build avx512] [--repeats 40] [--only bwd]

OLD_KERNELS_DIR (default /work/main/packages/layers/src/caffe/layers/kernels) holds the compiled kernels of another
checkout; --build picks the module of both (pooling, pooling_avx2, pooling_avx512; default: the one the layer
runs on this CPU). MAX 3x3 / stride 2 forward (with the argmax, and the values alone) and backward at the ResNet
(8x256x56x56) and MobileNet (8x64x112x112) shapes, and global AVE pooling forward / backward at 8x2048x7x7, old
and new alternating, medians of --repeats (ms), beside a np.copyto of the bottom (one read and one write of it)
and each case's "ideal": its bytes (inputs read + outputs written, the argmax counted apart as in
bench_memory.py) at the copy's bandwidth. Each case first runs both builds once on the same inputs and says whether
their outputs are the same bits. Between runs 64 MB are written (untimed; --hot: not), so that a run does not find its outputs in the L3
where the run before left them (in a net, other layers' data are there). With OMP_NUM_THREADS=1 the times are the thread's CPU time (time.thread_time: other processes' use of
the cores left out, not their use of the memory bus); "min" columns: the fastest run of each.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import numpy as np

from caffe.layers import _cpu

from ab_kernels import pair  # (this folder: the script's own, first on sys.path)

MAIN_KERNELS = "/work/main/packages/layers/src/caffe/layers/kernels"


def pooled(h, k, s, p):
    return -(-(h + 2 * p - k) // s) + 1


def cases(rng):
    out = []
    for sname, (N, C, H) in (("resnet", (8, 256, 56)), ("mobilenet", (8, 64, 112))):
        P = pooled(H, 3, 2, 0)
        x = rng.standard_normal(N * C * H * H, dtype=np.float32)
        y, mk = np.empty(N * C * P * P, np.float32), np.empty(N * C * P * P, np.int32)
        dy, dx = rng.standard_normal(y.size, dtype=np.float32), np.empty_like(x)
        importlib.import_module("caffe.layers.kernels.pooling").max_pool_forward(x, y, mk, N * C, H, H, P, P,
                                                                               3, 3, 2, 2, 0, 0)
        mask = mk.copy()
        io, top = x.nbytes, y.nbytes
        out += [
            (f"{sname} MAX 3/2 fwd", lambda k, x=x, y=y, mk=mk, n=N * C, H=H, P=P:
                k.max_pool_forward(x, y, mk, n, H, H, P, P, 3, 3, 2, 2, 0, 0), (y, mk), io + top, mk.nbytes),
            (f"{sname} MAX 3/2 fwd values", lambda k, x=x, y=y, n=N * C, H=H, P=P:
                k.max_pool_forward(x, y, None, n, H, H, P, P, 3, 3, 2, 2, 0, 0), (y,), io + top, 0),
            (f"{sname} MAX 3/2 bwd", lambda k, dy=dy, mask=mask, dx=dx, n=N * C, H=H, P=P:
                k.max_pool_backward(dy, mask, dx, n, H * H, P * P), (dx,), io + top, mask.nbytes),
        ]
    g = rng.standard_normal(8 * 2048 * 49, dtype=np.float32)
    gy, gdx = np.empty(8 * 2048, np.float32), np.empty_like(g)
    gdy = rng.standard_normal(gy.size, dtype=np.float32)
    out += [
        ("AVE global fwd 8x2048x7x7", lambda k: k.ave_pool_forward(g, gy, 8 * 2048, 7, 7, 1, 1, 7, 7, 1, 1, 0, 0),
         (gy,), g.nbytes + gy.nbytes, 0),
        ("AVE global bwd 8x2048x7x7", lambda k: k.ave_pool_backward(gdy, gdx, 8 * 2048, 7, 7, 1, 1, 7, 7, 1, 1, 0, 0),
         (gdx,), g.nbytes + gy.nbytes, 0),
    ]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_dir", nargs="?", default=MAIN_KERNELS)
    ap.add_argument("--build", default="pooling_avx512" if _cpu.USE_AVX512 else "pooling_avx2")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--hot", action="store_true", help="leave the caches as the last run left them (default: 64 MB "
                    "written between runs, untimed, as the layers between two calls in a net would)")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = ap.parse_args(argv)
    old, new = pair(args.build, args.old_dir)
    rng = np.random.default_rng(0)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())} "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')} {args.build}: old {old.__file__}")
    print(f"  {'case':30s} {'same':>5s} {'old ms':>7s} {'new ms':>7s} {'new/old':>7s} {'ideal':>6s} {'x old':>6s} "
          f"{'x new':>6s} {'x+st new':>8s} {'min old':>7s} {'min new':>7s}")
    clock = time.thread_time if os.environ.get("OMP_NUM_THREADS") == "1" else time.perf_counter
    src = rng.standard_normal(8 * 256 * 56 * 56, dtype=np.float32)
    dst = np.empty_like(src)
    only = [s for s in args.only.split(",") if s]
    evict = np.zeros(16 << 20, np.float32)
    for name, run, outs, nbytes, state in cases(rng):
        if only and not any(s in name for s in only):
            continue
        run(old)
        want = [o.copy() for o in outs]
        run(new)
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, outs))
        t_old, t_new, t_copy = [], [], []
        for rep in range(args.repeats):
            # ABBA: the one that runs second may find the first's data (the same inputs) in the caches
            pairs = ((old, t_old), (new, t_new))
            for k, ts in (pairs if rep % 2 == 0 else pairs[::-1]):
                if not args.hot:
                    evict += 1
                t0 = clock()
                run(k)
                ts.append(clock() - t0)
            t0 = clock()
            np.copyto(dst, src)
            t_copy.append(clock() - t0)
        bw = 2 * src.nbytes / statistics.median(t_copy)
        o, n = statistics.median(t_old) * 1e3, statistics.median(t_new) * 1e3
        ideal = nbytes / bw * 1e3
        st = f"{n / ((nbytes + state) / bw * 1e3):8.2f}" if state else f"{'':8s}"
        print(f"  {name:30s} {str(same):>5s} {o:7.3f} {n:7.3f} {n / o:7.2f} {ideal:6.3f} {o / ideal:6.2f} "
              f"{n / ideal:6.2f} {st} {min(t_old) * 1e3:7.3f} {min(t_new) * 1e3:7.3f}  (copy {bw / 1e9:.1f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
