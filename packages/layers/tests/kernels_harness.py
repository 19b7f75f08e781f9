"""Shared by the test_layers_kernels_* properties (imported by path, like layers2_pylayers).

run() sets a layer up and runs its forward and backward by either path: "cpu" (forward_cpu /
backward_cpu: the compiled kernels) or "xp" (forward_xp / backward_xp with NumPy: the GPU
path's code, which is the kernels' reference). check_paths() compares the CPU path with the
reference, and the two mixed runs (forward by one path, backward by the other: the state
backward needs goes through the layer's blobs, as a forward in CPU mode and a backward in
GPU mode would).
"""
from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from caffe.blob import context
from caffe.layers import _cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

DTYPES = st.sampled_from([np.float32, np.float64])
# Past CHUNK / PIECE and PARALLEL_MIN_WORK (32768), so pieces, remainders and both threads are exercised.
BIG_SHAPES = [(2, 5, 67, 101), (3, 40011), (1, 3, 11111)]


def shapes(min_dims=1, max_dims=4, max_side=6, big=BIG_SHAPES):
    small = hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)
    big = [s for s in big if min_dims <= len(s) <= max_dims]
    return st.one_of(small, st.sampled_from(big)) if big else small


def arrays(seed, shape, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


def run(type_name, text, bottoms, top_diffs=None, dtype=np.float64, in_place=False, n_top=1, phase=0,
        fwd="cpu", bwd="cpu", propagate_down=None, seed=3, setup=None):
    """Forward (and with top_diffs, backward) by the chosen paths; returns the outputs as arrays."""
    context.set_random_seed(seed)
    layer = make_layer(type_name, text, phase=phase)
    bottom = blobs_from_arrays(bottoms, dtype)
    top = [bottom[0]] if in_place else empty_tops(n_top, dtype)
    layer.SetUp(bottom, top)
    if setup is not None:
        setup(layer)
    layer.reshape(bottom, top)
    context.set_random_seed(seed + 1)
    if fwd == "cpu":
        layer.forward_cpu(bottom, top)
    else:
        layer.forward_xp(np, bottom, top)
    out = {"top": [t.data.copy() for t in top], "params": [p.data.copy() for p in layer.blobs]}
    if top_diffs is None:
        return out
    for t, d in zip(top, top_diffs):
        t.diff[...] = d
    pd = list(propagate_down) if propagate_down is not None else [True] * len(bottom)
    if bwd == "cpu":
        layer.backward_cpu(top, pd, bottom)
    else:
        layer.backward_xp(np, top, pd, bottom)
    out["bottom_diff"] = [b.diff.copy() for b, p in zip(bottom, pd) if p]
    out["param_diff"] = [p.diff.copy() for p in layer.blobs]
    return out


def tolerance(dtype, rtol=None):
    """(rtol, atol relative to the reference's magnitude): float32 results differ from NumPy's by
    summation order and libm ulps, float64 ones by rounding only."""
    if rtol is not None:
        return rtol, rtol
    return (2e-5, 2e-5) if np.dtype(dtype) == np.float32 else (1e-11, 1e-11)


def _magnitude(ref):
    """The scale of atol: the reference's largest finite magnitude, at least 1 (an inf in the reference must not
    make every other value's atol infinite)."""
    finite = np.abs(ref[np.isfinite(ref)])
    return max(1.0, float(finite.max())) if finite.size else 1.0


def assert_close(got, ref, dtype, rtol=None, what=""):
    r, a = tolerance(dtype, rtol)
    assert len(got) == len(ref), what
    for i, (g, e) in enumerate(zip(got, ref)):
        assert g.shape == e.shape, f"{what}[{i}]: shape {g.shape} vs {e.shape}"
        scale = _magnitude(e)
        np.testing.assert_allclose(g, e, rtol=r, atol=a * scale, equal_nan=False, err_msg=f"{what}[{i}]")


def _float64_run(type_name, text, bottoms, top_diffs, **kw):
    """The reference path in float64 on the float32 run's values (inputs, top diffs and parameters rounded to
    float32 first): the float32 runs' exact answer, up to float64 rounding."""
    def f32(a):
        return np.asarray(a, np.float32).astype(np.float64)
    setup = kw.pop("setup", None)

    def setup64(layer):
        if setup is not None:
            setup(layer)
        for b in layer.blobs:
            b.data[...] = f32(b.data)
            b.diff[...] = f32(b.diff)
    return run(type_name, text, [f32(b) for b in bottoms], None if top_diffs is None else [f32(d) for d in top_diffs],
               np.float64, fwd="xp", bwd="xp", setup=setup64, **kw)


def check_paths(type_name, text, bottoms, top_diffs, dtype, rtol=None, mixed=True, **kw):
    """The CPU path, and forward/backward by mixed paths, agree with the NumPy reference. In float32 a result that
    misses the reference's tolerance still passes where it is no farther from the float64 answer than the float32
    reference itself (plus the tolerance): a long sum that cancels (a scalar Scale's gradient over 120,000 products
    summing to 0.29) carries each order's rounding, NumPy's pairwise one included."""
    ref = run(type_name, text, bottoms, top_diffs, dtype, fwd="xp", bwd="xp", **kw)
    exact = {}
    combos = [("cpu", "cpu"), ("cpu", "xp"), ("xp", "cpu")] if mixed else [("cpu", "cpu")]
    for f, b in combos:
        got = run(type_name, text, bottoms, top_diffs, dtype, fwd=f, bwd=b, **kw)
        for key in ref:
            try:
                assert_close(got[key], ref[key], dtype, rtol, what=f"{type_name} {f}/{b} {key}")
            except AssertionError:
                if np.dtype(dtype) != np.float32:
                    raise
                if not exact:
                    exact.update(_float64_run(type_name, text, bottoms, top_diffs, **kw))
                assert_as_close_as_reference(got[key], ref[key], exact[key], rtol,
                                             what=f"{type_name} {f}/{b} {key}")
    return ref


def assert_as_close_as_reference(got, ref, exact, rtol=None, what=""):
    """got (float32) no farther from `exact` (the float64 answer) than the float32 reference `ref` is, plus the
    float32 tolerance."""
    r, a = tolerance(np.float32, rtol)
    for i, (g, e, x) in enumerate(zip(got, ref, exact)):
        with np.errstate(invalid="ignore"):  # inf - inf
            allowed = np.abs(e.astype(np.float64) - x) + a * _magnitude(x) + r * np.abs(x)
            far = ~(np.abs(g.astype(np.float64) - x) <= allowed) & ~(g == e) & ~(np.isnan(g) & np.isnan(x))
        assert not far.any(), (f"{what}[{i}]: {int(far.sum())} of {g.size} values farther from the float64 answer "
                               f"than the float32 reference: got {g[far][:5]}, reference {e[far][:5]}, "
                               f"float64 {x[far][:5]}")


# The builds of a kernel family (kernels.elementwise, kernels.softmax): the baseline, AVX2, AVX-512 (same sources).
BUILDS = ["base", "avx2", "avx512"]


def build_module(family, build):
    """The kernels module `family` in `build` (BUILDS), or a skip where this CPU cannot run that build."""
    if build == "avx512" and not _cpu.cpu_has_avx512():
        pytest.skip(f"this CPU lacks AVX-512 ({', '.join(_cpu.AVX512_FEATURES)}): {family}_avx512 cannot run here")
    if build in ("avx2", "avx512") and not (_cpu.cpu_has_avx2() and _cpu.cpu_has_avx2("FMA3")):
        pytest.skip(f"this CPU lacks AVX2 / FMA: {family}_{build} cannot run here")
    name = family if build == "base" else f"{family}_{build}"
    try:
        return importlib.import_module(f"caffe.layers.kernels.{name}")
    except ImportError as e:  # pragma: no cover - a source tree without the build
        pytest.fail(f"kernel build missing: {e}")


@contextlib.contextmanager
def layers_use(family, module):
    """The layers' CPU paths call `module` for the kernel family (_cpu.elementwise / _cpu.softmax) inside."""
    old = getattr(_cpu, family)
    setattr(_cpu, family, module)
    try:
        yield module
    finally:
        setattr(_cpu, family, old)
