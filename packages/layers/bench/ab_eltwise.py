"""Another build's Eltwise kernels ("old") against this checkout's ("new"), interleaved in one process.

Usage:  python packages/layers/bench/ab_eltwise.py OLD_KERNELS_DIR [--builds avx2,avx512] [--sizes 6422528]
        OMP_NUM_THREADS=1 python packages/layers/bench/ab_eltwise.py OLD_KERNELS_DIR   # one thread's CPU time
        python packages/layers/bench/ab_eltwise.py --stream [--sizes ...]   # this checkout, streaming off vs on

Eltwise MAX forward / backward, SUM backward and stable PROD backward with two bottoms (float32; 6422528 elements is
both 8x256x56x56 and 8x64x112x112: the kernels see a flat array), old and new alternating (order flipped every
repetition), medians of --repeats of wall time and process CPU time; with OMP_NUM_THREADS=1 the thread's CPU time is
the steadier figure on a busy machine. Each case first runs both on the same inputs and says whether the outputs
are the same bits. --stream: this checkout's build against itself with the streaming threshold at "never" (old)
and 0 (new), for choosing STREAM_MIN_BYTES.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import numpy as np

from ab_kernels import pair, same_bits  # (this folder: the script's own, first on sys.path)


class _Threshold:
    """The module with its streaming threshold set for the calls made through it."""

    def __init__(self, mod, nbytes):
        self.mod, self.nbytes = mod, nbytes

    def __getattr__(self, name):
        f = getattr(self.mod, name)

        def call(*a):
            old = self.mod._set_stream_min_bytes(self.nbytes)
            try:
                return f(*a)
            finally:
                self.mod._set_stream_min_bytes(old)
        return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", nargs="?", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--builds", default="avx2,avx512")
    ap.add_argument("--sizes", default="6422528")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--only", default="", help="comma-separated substrings of the case names")
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args(argv)
    from caffe.layers import _cpu
    one = os.environ.get("OMP_NUM_THREADS") == "1"
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load avg {' '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}  ms: wall / process CPU, median of "
          f"{args.repeats}")
    rng = np.random.default_rng(0)
    for build in args.builds.split(","):
        name = "elementwise" + ("" if build == "base" else "_" + build)
        if build == "avx512" and not _cpu.cpu_has_avx512():
            print(f"  {name}: this CPU has no AVX-512, skipped")
            continue
        if args.stream:
            mod = importlib.import_module(f"caffe.layers.kernels.{name}")
            old, new = _Threshold(mod, 1 << 62), _Threshold(mod, 0)
        else:
            old, new = pair(name, args.old)
        for n in (int(s) for s in args.sizes.split(",")):
            x0, x1 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
            dy = rng.standard_normal(n).astype(np.float32)
            y, mask, g0, g1 = np.empty_like(x0), np.empty(n, np.int32), np.empty_like(x0), np.empty_like(x0)
            e, e64 = np.empty(0, np.float32), np.empty(0)
            importlib.import_module(f"caffe.layers.kernels.{name}").eltwise_forward(2, [x0, x1], e64, y, mask)
            todo = [("MAX forward", lambda k: k.eltwise_forward(2, [x0, x1], e64, y, mask), (y, mask)),
                    ("MAX backward", lambda k: k.eltwise_backward(2, [x0, x1], [g0, g1], e64, e, dy, mask, False),
                     (g0, g1)),
                    ("SUM backward", lambda k: k.eltwise_backward(1, [x0, x1], [g0, g1], np.ones(2), e, dy, mask[:0],
                                                                  False), (g0, g1)),
                    ("PROD backward", lambda k: k.eltwise_backward(0, [x0, x1], [g0, g1], e64, e, dy, mask[:0], True),
                     (g0, g1))]
            mask0 = mask.copy()
            for case, run, outs in todo:
                if args.only and not any(w in case.lower() for w in args.only.lower().split(",")):
                    continue
                same = same_bits(run, old, new, outs)
                t = {0: [], 1: []}
                for i in range(args.repeats + 1):
                    for kk in ((0, 1) if i % 2 else (1, 0)):
                        w0, c0 = time.perf_counter(), (time.thread_time() if one else time.process_time())
                        run((old, new)[kk])
                        if i:
                            t[kk].append(((time.perf_counter() - w0) * 1e3,
                                          ((time.thread_time() if one else time.process_time()) - c0) * 1e3))
                (ow, oc), (nw, nc) = [[statistics.median(v[j] for v in t[kk]) for j in (0, 1)] for kk in (0, 1)]
                print(f"  {name:18s} n {n:8d} {case:14s} old {ow:6.2f} / {oc:6.2f}  new {nw:6.2f} / {nc:6.2f}  "
                      f"old/new wall {ow / nw:5.2f} cpu {oc / nc:5.2f}  {'same bits' if same else 'OUTPUTS DIFFER'}",
                      flush=True)
                np.copyto(mask, mask0)


if __name__ == "__main__":
    main()
