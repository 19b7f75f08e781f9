"""kernels.skinny_gemm (InnerProduct at a short batch): the three products against float64 NumPy, in every
build this CPU runs, and the InnerProduct layer with the kernels against its NumPy GEMM path.

Bound: each output is a float32 sum of K products (dots), N products (combine) or M products added to C
(rank_update), so |ours - exact| <= c * terms * eps * sum |a_i b_i| (+ the bias / C it adds, once). The
properties hold the kernels to terms * eps / 2 per unit of sum |a b| (NumPy's own float32 GEMM meets the
same bound); a wrong index, a dropped tail or a lost bias is off by O(1) of it.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.layers import _cpu, inner_product
from caffe.layers.testing import make_layer
from caffe.blob import Blob

EPS = float(np.finfo(np.float32).eps)
SEEDS = st.integers(0, 2**31 - 1)


def _builds():
    """The builds this CPU runs (the baseline always, where built)."""
    out = [("skinny_gemm", True)]
    out.append(("skinny_gemm_avx2", _cpu.cpu_has_avx2() and _cpu.cpu_has_avx2("FMA3")))
    out.append(("skinny_gemm_avx512", _cpu.cpu_has_avx512() and _cpu.cpu_has_avx2("FMA3")))
    return out


def _module(name):
    if not dict(_builds())[name]:
        pytest.skip(f"this CPU cannot run {name} (its AVX2/FMA or AVX-512 features are missing)")
    try:
        return importlib.import_module(f"caffe.layers.kernels.{name}")
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"kernel build missing: {e}")


BUILDS = pytest.mark.parametrize("name", [b for b, _ in _builds()])


def _check(out, exact, scale, terms):
    bound = max(terms, 1) * EPS / 2 * scale + 1e-30
    err = np.abs(out.astype(np.float64) - exact)
    assert (err <= bound).all(), f"max error / bound {float((err / bound).max()):.3g}"


# M past SG_MB (8) and into a second block; N, K past the vector width, the unrolled steps and the row
# groups, with odd remainders; 0-length K.
DIMS = st.tuples(st.integers(1, 19), st.integers(1, 70), st.integers(0, 140))


@BUILDS
@settings(max_examples=40)
@given(dims=DIMS, with_bias=st.booleans(), seed=SEEDS)
def test_dots(name, dims, with_bias, seed):
    build = _module(name)
    M, N, K = dims
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((N, K), dtype=np.float32)
    bias = rng.standard_normal(N, dtype=np.float32) if with_bias else None
    out = np.full((M, N), np.nan, np.float32)
    build.dots(a.ravel(), B.ravel(), out.ravel(), bias, M, N, K)
    b64 = bias.astype(np.float64) if with_bias else 0.0
    exact = a.astype(np.float64) @ B.T.astype(np.float64) + b64
    scale = np.abs(a).astype(np.float64) @ np.abs(B).T.astype(np.float64) + np.abs(b64)
    _check(out, exact, scale, K + 1)


@BUILDS
@settings(max_examples=40)
@given(dims=DIMS, with_bias=st.booleans(), seed=SEEDS)
def test_combine(name, dims, with_bias, seed):
    build = _module(name)
    M, N, K = dims  # out (M, K) = a (M, N) @ B (N, K)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, N), dtype=np.float32)
    B = rng.standard_normal((N, K), dtype=np.float32)
    bias = rng.standard_normal(K, dtype=np.float32) if with_bias else None
    out = np.full((M, K), np.nan, np.float32)
    build.combine(a.ravel(), B.ravel(), out.ravel(), bias, M, N, K)
    b64 = bias.astype(np.float64) if with_bias else 0.0
    exact = a.astype(np.float64) @ B.astype(np.float64) + b64
    scale = np.abs(a).astype(np.float64) @ np.abs(B).astype(np.float64) + np.abs(b64)
    _check(out, exact, scale, N + 1)


@BUILDS
@settings(max_examples=40)
@given(dims=DIMS, seed=SEEDS)
def test_rank_update(name, dims, seed):
    build = _module(name)
    M, N, K = dims  # C (N, K) += a (M, N)^T @ b (M, K)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, N), dtype=np.float32)
    b = rng.standard_normal((M, K), dtype=np.float32)
    C = rng.standard_normal((N, K), dtype=np.float32)
    C0 = C.astype(np.float64)
    build.rank_update(a.ravel(), b.ravel(), C.ravel(), M, N, K)
    exact = C0 + a.T.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.T).astype(np.float64) @ np.abs(b).astype(np.float64) + np.abs(C0)
    _check(C, exact, scale, M + 1)


@BUILDS
def test_results_do_not_depend_on_threads(name):
    build = _module(name)
    """Each output is one thread's fixed-order sum: a large call (both threads) equals its rows' calls."""
    rng = np.random.default_rng(5)
    M, N, K = 5, 301, 517
    a = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((N, K), dtype=np.float32)
    whole = np.full((M, N), np.nan, np.float32)
    build.dots(a.ravel(), B.ravel(), whole.ravel(), None, M, N, K)
    # every row of B computed once (a thread's share that slips by a row leaves a column unwritten)
    _check(whole, a.astype(np.float64) @ B.T, np.abs(a).astype(np.float64) @ np.abs(B).T, K + 1)
    for n in (0, 17, 300):  # one row alone (one thread, a short row group)
        part = np.empty((M, 1), np.float32)
        build.dots(a.ravel(), np.ascontiguousarray(B[n]), part.ravel(), None, M, 1, K)
        np.testing.assert_array_equal(part[:, 0], whole[:, n])


@BUILDS
def test_combine_and_rank_update_split_among_threads(name):
    """Past PARALLEL_MIN_WORK (N K >= 32768) combine splits out's columns among the threads (at multiples of
    4 vectors) and rank_update C's rows: every column and row is computed once, by one thread. K = 517 puts
    the column split off a multiple of 4 (260 of 517) and of 4 vectors (256): a split whose two ends disagree
    leaves a gap; the rows: one thread's first row is the other's last + 1 (a one-row slip misses it)."""
    build = _module(name)
    rng = np.random.default_rng(7)
    M, N, K = 3, 70, 517
    a = rng.standard_normal((M, N), dtype=np.float32)
    B = rng.standard_normal((N, K), dtype=np.float32)
    bias = rng.standard_normal(K, dtype=np.float32)
    out = np.full((M, K), np.nan, np.float32)
    build.combine(a.ravel(), B.ravel(), out.ravel(), bias, M, N, K)
    _check(out, a.astype(np.float64) @ B + bias, np.abs(a).astype(np.float64) @ np.abs(B) + np.abs(bias), N + 1)
    # and the same bits as one column alone (one thread, the scalar path: one FMA a step, as the vectors)
    for k in (0, 255, 256, 259, 260, 516):
        col = np.empty(M, np.float32)
        build.combine(a.ravel(), np.ascontiguousarray(B[:, k]), col, bias[k:k + 1], M, N, 1)
        np.testing.assert_array_equal(col, out[:, k])
    M, N, K = 3, 301, 130  # C (N, K) += a (M, N)^T @ b (M, K)
    a = rng.standard_normal((M, N), dtype=np.float32)
    b = rng.standard_normal((M, K), dtype=np.float32)
    C = rng.standard_normal((N, K), dtype=np.float32)
    C0 = C.astype(np.float64)
    build.rank_update(a.ravel(), b.ravel(), C.ravel(), M, N, K)
    _check(C, C0 + a.T.astype(np.float64) @ b, np.abs(a.T).astype(np.float64) @ np.abs(b) + np.abs(C0), M + 1)
    for n in (0, 149, 150, 151, 300):
        row = C0[n].astype(np.float32)
        build.rank_update(np.ascontiguousarray(a[:, n]), b.ravel(), row, M, 1, K)
        np.testing.assert_array_equal(row, C[n])


@BUILDS
@pytest.mark.parametrize("bias", [False, True])
def test_empty_sums(name, bias):
    """A sum of no terms is 0: dots with K = 0 and combine with N = 0 write the bias (or zeros),
    rank_update with M = 0 leaves C as it is; an empty output (M = 0) is not touched."""
    build = _module(name)
    rng = np.random.default_rng(3)
    M, N = 5, 7
    bs = rng.standard_normal(N, dtype=np.float32) if bias else None
    want = np.broadcast_to(bs if bias else np.float32(0), (M, N))
    out = np.full(M * N, np.nan, np.float32)
    build.dots(np.zeros(0, np.float32), np.zeros(0, np.float32), out, bs, M, N, 0)
    np.testing.assert_array_equal(out.reshape(M, N), want)
    out = np.full(M * N, np.nan, np.float32)
    build.combine(np.zeros(0, np.float32), np.zeros(0, np.float32), out, bs, M, 0, N)
    np.testing.assert_array_equal(out.reshape(M, N), want)
    C = rng.standard_normal(N * 3, dtype=np.float32)
    C0 = C.copy()
    build.rank_update(np.zeros(0, np.float32), np.zeros(0, np.float32), C, 0, N, 3)
    np.testing.assert_array_equal(C, C0)
    out = np.full(4, np.nan, np.float32)
    build.dots(np.ones(6, np.float32), np.ones(6 * N, np.float32), out, bs, 0, N, 6)
    build.combine(np.ones(6, np.float32), np.ones(6 * N, np.float32), out, bs, 0, 6, N)
    assert np.isnan(out).all()


@BUILDS
def test_short_arrays_are_refused(name):
    build = _module(name)
    f = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="B has 10 elements, needs 12"):
        build.dots(f, f, f, None, 1, 3, 4)
    with pytest.raises(ValueError, match="bias has 10 elements, needs 11"):
        build.combine(np.zeros(11, np.float32), np.zeros(121, np.float32), np.zeros(11, np.float32), f,
                      1, 11, 11)
    with pytest.raises(ValueError, match="C has 10 elements"):
        build.rank_update(f, f, f, 1, 5, 5)


# -- the layer ------------------------------------------------------------------------------------------

def _ip(num_output, transpose, bias_term):
    return (f"inner_product_param {{ num_output: {num_output} transpose: {str(transpose).lower()} "
            f"bias_term: {str(bias_term).lower()} weight_filler {{ type: 'gaussian' std: 1 }} "
            "bias_filler { type: 'gaussian' std: 1 } }")


def _run_layer(skinny, x, dy, w, b, num_output, transpose):
    old = inner_product.SKINNY
    inner_product.SKINNY = skinny
    try:
        layer = make_layer("InnerProduct", _ip(num_output, transpose, b is not None))
        bottom, top = Blob(x.shape, dtype=np.float32), Blob()
        bottom.data[...] = x
        layer.SetUp([bottom], [top])
        layer.blobs[0].data[...] = w
        layer.blobs[0].diff[...] = 0.5  # the weight diff accumulates (Caffe's beta = 1)
        if b is not None:
            layer.blobs[1].data[...] = b
        layer.Forward([bottom], [top])
        y = top.data.copy()
        top.diff[...] = dy
        layer.Backward([top], [True], [bottom])
        return y, bottom.diff.copy(), layer.blobs[0].diff.copy(), layer.M
    finally:
        inner_product.SKINNY = old


@settings(max_examples=25)
@given(M=st.integers(1, 18), K=st.integers(1, 90), N=st.integers(1, 60), transpose=st.booleans(),
       bias=st.booleans(), seed=SEEDS)
def test_inner_product_layer_with_kernels(M, K, N, transpose, bias, seed):
    """Forward, bottom diff and (accumulated) weight diff of a float32 InnerProduct with skinny_gemm equal
    the NumPy GEMM path's within the float32 bound (taken twice: both round); at M past SKINNY_M the
    layer runs NumPy's GEMM (the same bits)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((K, N) if transpose else (N, K), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32) if bias else None
    dy = rng.standard_normal((M, N), dtype=np.float32)
    ours = _run_layer(True, x, dy, w, b, N, transpose)
    ref = _run_layer(False, x, dy, w, b, N, transpose)
    W = (w if transpose else w.T).astype(np.float64)  # y = x @ W, W (K, N)
    aW = np.abs(W)
    scale_y = np.abs(x).astype(np.float64) @ aW + (np.abs(b) if bias else 0)
    scale_dx = np.abs(dy).astype(np.float64) @ aW.T
    scale_dw = np.abs(x.T).astype(np.float64) @ np.abs(dy) + 0.5
    if not transpose:
        scale_dw = scale_dw.T
    for o, r, scale, terms in ((ours[0], ref[0], scale_y, K + 1), (ours[1], ref[1], scale_dx, N),
                               (ours[2], ref[2], scale_dw, M + 1)):
        assert o.shape == r.shape
        err = np.abs(o.astype(np.float64) - r)
        assert (err <= 2 * terms * EPS / 2 * scale + 1e-30).all()
    if _cpu.skinny_gemm is None or M > max(hi for _, hi in inner_product.SKINNY_M.values()):
        for o, r in zip(ours[:3], ref[:3]):
            np.testing.assert_array_equal(o, r)


@settings(max_examples=25)
@given(M=st.integers(17, 70), K=st.integers(1, 90), N=st.integers(1, 60), transpose=st.booleans(),
       bias=st.booleans(), seed=SEEDS)
def test_inner_product_backward_by_kernels_gemm(M, K, N, transpose, bias, seed):
    """Past the skinny range, the float32 backward's GEMMs by kernels.gemm (inner_product.GEMM512_BACKWARD, where
    conv_cpu's GEMM512 and BLAS512 are set; forced here, every size): the bottom diff and the weight diff,
    accumulated in place onto 0.5, equal NumPy's within the float32 bound; the forward is NumPy's (the same
    bits)."""
    from caffe.layers import conv_cpu
    if not conv_cpu.gemm512_supported():
        pytest.skip("kernels.gemm needs AVX-512F")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((K, N) if transpose else (N, K), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32) if bias else None
    dy = rng.standard_normal((M, N), dtype=np.float32)
    calls = []
    real = conv_cpu._gm

    class Spy:
        def gemm(self, *args):
            calls.append(args[4] if len(args) > 4 else 0)
            return real.gemm(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_cpu, "GEMM512", True)
        mp.setattr(conv_cpu, "BLAS512", True)
        mp.setattr(conv_cpu, "_gm", Spy())
        mp.setattr(inner_product, "GEMM512_MIN_MACS", 0)
        ours = _run_layer(False, x, dy, w, b, N, transpose)
    assert sorted(calls) == [0, 1]  # the bottom diff (beta 0) and the weight diff (beta 1, in place)
    ref = _run_layer(False, x, dy, w, b, N, transpose)
    W = (w if transpose else w.T).astype(np.float64)
    scale_dx = np.abs(dy).astype(np.float64) @ np.abs(W).T
    scale_dw = np.abs(x.T).astype(np.float64) @ np.abs(dy) + 0.5
    if not transpose:
        scale_dw = scale_dw.T
    np.testing.assert_array_equal(ours[0], ref[0])
    for o, r, scale, terms in ((ours[1], ref[1], scale_dx, N), (ours[2], ref[2], scale_dw, M + 1)):
        err = np.abs(o.astype(np.float64) - r)
        assert (err <= 2 * terms * EPS / 2 * scale + 1e-30).all()


def test_inner_product_layer_takes_the_kernels(monkeypatch):
    """At batch 8 (CaffeNet's fc layers at b8) float32 runs all three products in skinny_gemm; float64 and
    batch 64 do not."""
    if _cpu.skinny_gemm is None:
        pytest.skip("kernels.skinny_gemm is not built here")
    calls = []

    class Spy:
        def __getattr__(self, name):
            fn = getattr(real, name)

            def wrapped(*args):
                calls.append(name)
                return fn(*args)
            return wrapped

    real = _cpu.skinny_gemm
    monkeypatch.setattr(_cpu, "skinny_gemm", Spy())
    rng = np.random.default_rng(0)
    for M, dtype, expect in ((8, np.float32, ["dots", "rank_update", "combine"]), (64, np.float32, []),
                             (8, np.float64, [])):
        calls.clear()
        layer = make_layer("InnerProduct", _ip(7, False, True))
        bottom, top = Blob((M, 3, 5), dtype=dtype), Blob()
        bottom.data[...] = rng.standard_normal(bottom.shape)
        layer.SetUp([bottom], [top])
        layer.Forward([bottom], [top])
        top.diff[...] = 1
        layer.Backward([top], [True], [bottom])
        assert calls == expect, (M, dtype)


@BUILDS
@settings(max_examples=12)
@given(dims=DIMS, seed=SEEDS)
def test_prefetch_changes_no_bits(name, dims, seed):
    """The software prefetch (PREFETCH_MIN_FLOATS: large weights only) reads ahead and changes no sum: with it
    forced on (threshold 0) dots, combine and rank_update give the bits they give without it."""
    build = _module(name)
    M, N, K = dims
    M = max(M, 2)  # (M = 1 never prefetches)
    rng = np.random.default_rng(seed)
    a_mk = rng.standard_normal(M * K, dtype=np.float32)
    a_mn = rng.standard_normal(M * N, dtype=np.float32)
    B = rng.standard_normal(N * K, dtype=np.float32)
    C0 = rng.standard_normal(N * K, dtype=np.float32)
    bias = rng.standard_normal(max(N, K), dtype=np.float32)
    runs = []
    for threshold in (1 << 62, 0):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(build, "PREFETCH_MIN_FLOATS", threshold)
            d = np.full(M * N, np.nan, np.float32)
            c = np.full(M * K, np.nan, np.float32)
            r = C0.copy()
            if K:
                build.dots(a_mk, B, d, bias[:N], M, N, K)
            build.combine(a_mn, B, c, bias[:K], M, N, K)
            build.rank_update(a_mn, a_mk, r, M, N, K)
        runs.append((d, c, r))
    for before, after in zip(*runs):
        np.testing.assert_array_equal(before.view(np.uint32), after.view(np.uint32))
