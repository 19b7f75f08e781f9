"""The float32 / float64 softmax forward and SoftmaxWithLoss forward of another build ("old") against this checkout's
on random small shapes, a third of them with NaN / +-inf / large inputs, through the three forward paths (in place,
scratch with normal stores, scratch streamed): every non-NaN output and the loss the same bits; NaN outputs at the
same places, and how many carry another NaN payload (printed, not failed: which NaN an addition of two NaNs keeps
depends on GCC's operand order in a vectorized loop's peel and body).

Usage:  python packages/layers/bench/softmax_bits.py OLD_KERNELS_DIR [--cases 300]
"""
from __future__ import annotations

import argparse

import numpy as np

from ab_kernels import pair  # (this folder: the script's own, first on sys.path)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("old", help="the other build's caffe/layers/kernels folder")
    ap.add_argument("--cases", type=int, default=300, help="random cases per build, dtype and path")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    for name, dt in (("softmax_avx512", np.float32), ("softmax_avx2", np.float32), ("softmax_avx512", np.float64),
                     ("softmax", np.float32), ("softmax", np.float64)):
        old, new = pair(name, args.old)
        payloads = cases = 0
        for mode in (None, (0, 0), (1 << 40, 0)):  # default (in place here), streamed, scratch with normal stores
            prev = [k._set_stream_min_bytes(*mode) for k in (old, new)] if mode else None
            for it in range(args.cases):
                outer, c, inner = int(rng.integers(1, 4)), int(rng.integers(1, 70)), int(rng.integers(2, 300))
                x = (rng.standard_normal(outer * c * inner) * rng.choice([1, 40])).astype(dt)
                if it % 3 == 0:
                    idx = rng.integers(0, x.size, max(1, x.size // 50))
                    x[idx] = rng.choice([np.nan, np.inf, -np.inf, 0.0, 88.0, -200.0], idx.size)
                lab = rng.integers(0, c, outer * inner).astype(np.int64)
                val = (rng.random(outer * inner) < 0.8).astype(np.uint8)
                for loss in (False, True):
                    ya, yb = np.empty_like(x), np.empty_like(x)
                    if loss:
                        la = old.softmax_loss_forward(x, ya, lab, val, outer, c, inner)
                        lb = new.softmax_loss_forward(x, yb, lab, val, outer, c, inner)
                        assert la == lb or (la != la and lb != lb), (name, dt, mode, outer, c, inner, la, lb)
                    else:
                        old.softmax_forward(x, ya, outer, c, inner)
                        new.softmax_forward(x, yb, outer, c, inner)
                    nan = np.isnan(ya)
                    assert (nan == np.isnan(yb)).all() and ya[~nan].tobytes() == yb[~nan].tobytes(), \
                        (name, dt, mode, outer, c, inner)
                    payloads += int((ya.view(f"u{ya.itemsize}") != yb.view(f"u{yb.itemsize}")).sum())
                cases += 1
            if prev:
                for k, p in zip((old, new), prev):
                    k._set_stream_min_bytes(*p)
        print(f"{name} {np.dtype(dt).name}: {cases} cases, the same bits but for {payloads} NaN payloads")


if __name__ == "__main__":
    main()
