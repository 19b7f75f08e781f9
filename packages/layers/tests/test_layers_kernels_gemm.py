"""kernels.gemm (the AVX-512 packed sgemm) against a float64 NumPy reference, and conv_cpu's 1x1 plan with it.

Bound: the kernel sums each C[m, n] in float32, one FMA per k, then beta C and the bias, each a float32 add;
a recursive float32 sum of L terms is within (L - 1) u sum|terms| of the exact one (u = 2^-24), so with
L = K + 2 (the products, C's old value, the bias) the test allows (K + 2) u (sum_k |A B| + beta |C| + |bias|)
against the float64 reference (whose own error is ~2^-53 relative: negligible), times the activation's
Lipschitz constant (ReLU with slope a: max(1, |a|); clip: 1). NumPy's float32 matmul meets the same bound in
its own order, so the 1x1 plan with and without the kernel differ by at most twice it.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.layers import conv_base, conv_cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

gm = pytest.importorskip("caffe.layers.kernels.gemm")

U = 2.0 ** -24
NEEDS_AVX512 = pytest.mark.skipif(not gm.supported(), reason="this CPU has no AVX-512F: kernels.gemm cannot run "
                                  "here (conv_cpu never chooses it)")


def act_ref(y, act, lo, hi):
    """kernels.lowering's epilogue on float64 values (the bound absorbs the final rounding)."""
    if act == 1:
        return np.where(y <= 0, 0.0, y) if lo == 0 else np.where(y > 0, y, y * lo)
    if act == 2:
        return np.where(y < lo, lo, np.where(y > hi, hi, y))
    return y


def bound(a, b, c0, bias, beta, act, lo):
    K = a.shape[1]
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    if beta:
        mag += np.abs(c0)
    if bias is not None:
        mag += np.abs(bias.astype(np.float64))[:, None]
    lip = max(1.0, abs(lo)) if act == 1 else 1.0
    return (K + 2) * U * mag * lip + 1e-30


def layout(rng, shape, how):
    """A float32 array of `shape`: "c" row-major, "t" a transposed (column-major) view, "r" a view with its
    rows reversed and every other column (negative and non-unit strides)."""
    if how == "t":
        return rng.standard_normal(shape[::-1]).astype(np.float32).T
    if how == "r":
        return rng.standard_normal((shape[0], 2 * shape[1])).astype(np.float32)[::-1, ::2]
    return rng.standard_normal(shape).astype(np.float32)


@NEEDS_AVX512
@settings(max_examples=30)  # cheap examples (~10 ms); many axes to cover
@given(M=st.integers(1, 40), N=st.integers(1, 130), K=st.sampled_from([1, 2, 3, 7, 16, 33, 100, 384, 385, 800]),
       ta=st.sampled_from('ctr'), tb=st.sampled_from('ctr'), beta=st.sampled_from([0, 1]), bias=st.booleans(),
       act=st.sampled_from([(0, 0.0, 0.0), (1, 0.0, 0.0), (1, 0.25, 0.0), (2, -0.5, 0.75)]),
       pad=st.sampled_from([0, 5]), threads=st.sampled_from([0, 1, 2]), seed=st.integers(0, 2**31 - 1))
def test_gemm_matches_numpy_within_the_float32_sum_bound(M, N, K, ta, tb, beta, bias, act, pad, threads, seed):
    rng = np.random.default_rng(seed)
    a, b = layout(rng, (M, K), ta), layout(rng, (K, N), tb)
    big = rng.standard_normal((M, N + pad)).astype(np.float32)
    c = big[:, :N]  # a row stride past N when padded
    c0 = c.astype(np.float64)
    past = big[:, N:].copy()
    bs = rng.standard_normal(M).astype(np.float32) if bias else None
    code, lo, hi = act
    gm.gemm(a, b, c, bs, beta, code, lo, hi, threads)
    exact = a.astype(np.float64) @ b.astype(np.float64) + (c0 if beta else 0) + (bs[:, None] if bias else 0)
    ref = act_ref(exact, code, lo, hi)
    assert np.all(np.abs(c - ref) <= bound(a, b, c0, bs, beta, code, lo))
    np.testing.assert_array_equal(big[:, N:], past)  # columns past N untouched


@NEEDS_AVX512
@pytest.mark.parametrize("M,N,K", [(100, 49, 500), (9, 1000, 64), (64, 196, 1030)])
def test_gemm_two_threads_and_row_splits_give_the_one_thread_bits(M, N, K):
    """Each C element's sum order does not depend on the thread count or the task split (rows are split when
    there are few column blocks: N = 49)."""
    rng = np.random.default_rng(M + N + K)
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    one, two = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    gm.gemm(a, b, one, bias, 0, 1, 0.1, 0, 1)
    gm.gemm(a, b, two, bias, 0, 1, 0.1, 0, 2)
    np.testing.assert_array_equal(one, two)
    ref = act_ref(a.astype(np.float64) @ b.astype(np.float64) + bias[:, None], 1, 0.1, 0)
    assert np.all(np.abs(one - ref) <= bound(a, b, None, bias, 0, 1, 0.1))


@NEEDS_AVX512
def test_gemm_every_layout_across_k_blocks():
    """Each way A and B are read (A row-major or column-major in place, packed; B packed from rows or by 8 x 8
    transposes, or by scalars), each over three K blocks (K = 800 > 2 GM_KC): N = 49 reads A in place, N = 100
    packs it; M = 17 is two full row panels and a short one."""
    rng = np.random.default_rng(11)
    M, K = 17, 800
    assert K > 2 * gm.BLOCKS[0] and 49 <= gm.TILE[1] * 2 < 100
    for N in (49, 100):
        for ta in "ctr":
            for tb in "ctr":
                a, b = layout(rng, (M, K), ta), layout(rng, (K, N), tb)
                c = rng.standard_normal((M, N)).astype(np.float32)
                c0 = c.astype(np.float64)
                bs = rng.standard_normal(M).astype(np.float32)
                gm.gemm(a, b, c, bs, 1, 1, 0.25, 0.0)
                ref = act_ref(a.astype(np.float64) @ b.astype(np.float64) + c0 + bs[:, None], 1, 0.25, 0.0)
                assert np.all(np.abs(c - ref) <= bound(a, b, c0, bs, 1, 1, 0.25)), (N, ta, tb)


@NEEDS_AVX512
def test_gemm_keeps_nan_through_relu_and_clip():
    a = np.ones((9, 3), np.float32)
    b = np.ones((3, 17), np.float32)
    b[1, 4] = np.nan
    for code, lo, hi in ((1, 0.0, 0.0), (1, 0.5, 0.0), (2, -1.0, 1.0)):
        c = np.empty((9, 17), np.float32)
        gm.gemm(a, b, c, None, 0, code, lo, hi)
        assert np.isnan(c[:, 4]).all() and not np.isnan(np.delete(c, 4, axis=1)).any()


def test_gemm_refuses_bad_arguments():
    a, b, c = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32), np.empty((4, 5), np.float32)
    with pytest.raises(ValueError):
        gm.gemm(a, b, np.empty((4, 6), np.float32))
    with pytest.raises(ValueError):
        gm.gemm(a, np.ones((2, 5), np.float32), c)
    with pytest.raises(ValueError):
        gm.gemm(a, b, c, beta=2)
    with pytest.raises(ValueError):
        gm.gemm(a, b, c, act=3)
    with pytest.raises(ValueError):
        gm.gemm(a, b, np.empty((5, 4), np.float32).T)  # c's rows not contiguous
    with pytest.raises(ValueError):
        gm.gemm(a, b, c, np.ones(3, np.float32))  # bias shorter than M
    if not gm.supported():
        with pytest.raises(RuntimeError):
            gm.gemm(a, b, c)


def _packed_floats(rng, shape):
    """A float32 view whose elements are 5 bytes apart (the "x" field of a packed record array): strides that
    are not whole floats."""
    rec = np.zeros(shape, dtype=[("x", "<f4"), ("y", "u1")])
    rec["x"] = rng.standard_normal(shape)
    return rec["x"]


def test_gemm_refuses_strides_that_are_not_whole_floats():
    """The kernel addresses A, B and C in whole floats (stride // 4): a view stepping 5 bytes is refused, not
    read (or written) at the wrong elements."""
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((6, 4)).astype(np.float32), np.ones((4, 5), np.float32), np.empty((6, 5), np.float32)
    for args in ((_packed_floats(rng, (6, 4)), b, c), (a, _packed_floats(rng, (4, 5)), c),
                 (a, b[:, :1], _packed_floats(rng, (6, 1)))):
        assert any(s % 4 for x in args for s in x.strides)
        with pytest.raises(ValueError, match="whole floats"):
            gm.gemm(*args)
    # a length-1 axis's stride is never used: any value is accepted
    col = np.lib.stride_tricks.as_strided(a, shape=(6, 1), strides=(16, 5))
    if gm.supported():
        out = np.empty((6, 5), np.float32)
        gm.gemm(col, b[:1], out)
        np.testing.assert_array_equal(out, np.repeat(a[:, :1], 5, axis=1))


# -- conv_cpu's 1x1 plan ------------------------------------------------------------------------------

class _Counting:
    """conv_cpu._gm with its gemm calls counted."""

    def __init__(self):
        self.calls = 0

    def gemm(self, *args):
        self.calls += 1
        return gm.gemm(*args)


def _forward(x, text, epilogue, use, mp):
    mp.setattr(conv_cpu, "GEMM512", use)
    counting = _Counting()
    mp.setattr(conv_cpu, "_gm", counting)
    layer = make_layer("Convolution", text)
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    layer.epilogue = epilogue
    layer.Forward(bottom, top)
    assert layer.plan(np, np.float32) == "1x1"
    return top[0].data.astype(np.float64), layer, counting.calls


@NEEDS_AVX512
@given(N=st.integers(1, 3), cg=st.integers(33, 70), og=st.integers(1, 40), HW=st.sampled_from([(1, 1), (3, 5), (23, 23)]),
       group=st.sampled_from([1, 2]), bias=st.booleans(), act=st.sampled_from([None, (1, 0.0, 0.0), (2, -0.3, 0.4)]),
       seed=st.integers(0, 2**31 - 1))
def test_1x1_plan_with_the_kernel_matches_it_without(N, cg, og, HW, group, bias, act, seed):
    """The 1x1 plan's float32 forward (kernel_dim > EXACT_FORWARD_MAX_K, so not the exact path) with
    kernels.gemm and with np.matmul, both within the bound of the float64 product: images read in place (23 x
    23 = 529 positions) and copied side by side (smaller), groups, bias, the fused activations."""
    C, Co = cg * group, og * group
    fill = "weight_filler { type: 'gaussian' std: 0.3 } bias_filler { type: 'gaussian' std: 0.5 }"
    text = (f"convolution_param {{ num_output: {Co} kernel_size: 1 group: {group} "
            f"bias_term: {'true' if bias else 'false'} {fill} }}")
    x = np.random.default_rng(seed).standard_normal((N, C, *HW)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        got, layer, calls = _forward(x, text, act, True, mp)
    weights = layer.blobs[0].data.reshape(group, Co // group, -1).astype(np.float64)
    b = layer.blobs[1].data.astype(np.float64) if bias else np.zeros(Co)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_cpu, "GEMM512", False)
        bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.blobs[0].data[...] = weights.reshape(layer.blobs[0].data.shape)
        if bias:
            layer.blobs[1].data[...] = b
        layer.epilogue = act
        layer.Forward(bottom, top)
        off = top[0].data.astype(np.float64)
    assert calls >= 1
    xs = x.astype(np.float64).reshape(N, group, C // group, -1)
    exact = np.einsum("gok,ngkp->ngop", weights, xs).reshape(N, Co, -1) + b[None, :, None]
    mag = np.einsum("gok,ngkp->ngop", np.abs(weights), np.abs(xs)).reshape(N, Co, -1) + np.abs(b)[None, :, None]
    code, lo, hi = act if act is not None else (0, 0.0, 0.0)
    ref = act_ref(exact, code, lo, hi)
    tol = (C // group + 2) * U * mag
    for y in (got, off):
        assert np.all(np.abs(y.reshape(N, Co, -1) - ref) <= tol)


@NEEDS_AVX512
def test_1x1_plan_keeps_matmul_for_short_k_and_float64(monkeypatch):
    """kernel_dim <= EXACT_FORWARD_MAX_K goes the exact float64 path, float64 blobs np.matmul: no kernels.gemm."""
    for C, dtype in ((8, np.float32), (40, np.float64)):
        x = np.random.default_rng(C).standard_normal((2, C, 5, 5)).astype(dtype)
        monkeypatch.setattr(conv_cpu, "GEMM512", True)
        counting = _Counting()
        monkeypatch.setattr(conv_cpu, "_gm", counting)
        layer = make_layer("Convolution", "convolution_param { num_output: 6 kernel_size: 1 "
                           "weight_filler { type: 'gaussian' std: 0.3 } }")
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        assert counting.calls == 0


def _gemm512_in(env):
    code = "from caffe.layers import conv_cpu; print(conv_cpu.GEMM512, conv_cpu.blas_corename())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", out[1]


def test_gemm512_choice_follows_the_cpu_and_switches():
    """On wherever kernels.gemm runs (AVX-512F), whatever kernels NumPy's OpenBLAS runs (Haswell's AVX2 or
    SkylakeX's AVX-512: kernels.gemm measured faster than both); off under either switch."""
    expect = (gm.supported() and os.environ.get("CAFFE_KERNELS_AVX512", "1") != "0"
              and os.environ.get("CAFFE_CONV_GEMM512", "1") != "0")
    assert conv_cpu.GEMM512 == expect
    assert _gemm512_in({"CAFFE_KERNELS_AVX512": "0"})[0] is False
    assert _gemm512_in({"CAFFE_CONV_GEMM512": "0"})[0] is False
    if gm.supported():
        for core in ("Haswell", "SkylakeX"):
            assert _gemm512_in({"OPENBLAS_CORETYPE": core})[0] is expect


@NEEDS_AVX512
@given(N=st.integers(1, 3), cg=st.integers(1, 40), og=st.integers(1, 40), HW=st.sampled_from([(1, 1), (3, 5), (23, 23)]),
       group=st.sampled_from([1, 2]), use=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_1x1_plan_backward_with_and_without_the_kernel(N, cg, og, HW, group, use, seed):
    """The 1x1 plan's float32 backward (GEMM512 on: kernels.gemm, the weight diff accumulated in place onto
    the diff already there; off: np.matmul) within the float32 sum bounds of the float64 products: the bottom
    diff sums og terms per group, (og + 2) u sum|w dy|; the weight diff sums P terms per image and adds each
    image's sum to the running diff, (N (P + 2) + 1) u (sum|dy x| + |old diff|)."""
    C, Co = cg * group, og * group
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, *HW)).astype(np.float32)
    dy = rng.standard_normal((N, Co, *HW)).astype(np.float32)
    layer = make_layer("Convolution", f"convolution_param {{ num_output: {Co} kernel_size: 1 group: {group} "
                       "weight_filler { type: 'gaussian' std: 0.3 } bias_filler { type: 'gaussian' std: 0.5 } }")
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    old = rng.standard_normal((Co, C // group)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_cpu, "GEMM512", use)
        counting = _Counting()
        mp.setattr(conv_cpu, "_gm", counting)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        top[0].diff[...] = dy
        layer.blobs[0].diff[...] = old.reshape(layer.blobs[0].diff.shape)
        layer.blobs[1].diff[...] = 0
        layer.Backward(top, [True], bottom)
    assert layer.plan(np, np.float32) == "1x1" and (counting.calls > 0) == use
    P = HW[0] * HW[1]
    w = layer.blobs[0].data.reshape(group, og, cg).astype(np.float64)
    xs = x.astype(np.float64).reshape(N, group, cg, P)
    dys = dy.astype(np.float64).reshape(N, group, og, P)
    dx = np.einsum("goc,ngop->ngcp", w, dys)
    dx_mag = np.einsum("goc,ngop->ngcp", np.abs(w), np.abs(dys))
    got_dx = bottom[0].diff.astype(np.float64).reshape(N, group, cg, P)
    assert np.all(np.abs(got_dx - dx) <= (og + 2) * U * dx_mag + 1e-30)
    dw = np.einsum("ngop,ngcp->goc", dys, xs).reshape(Co, cg) + old
    dw_mag = np.einsum("ngop,ngcp->goc", np.abs(dys), np.abs(xs)).reshape(Co, cg) + np.abs(old)
    got_dw = layer.blobs[0].diff.astype(np.float64).reshape(Co, cg)
    assert np.all(np.abs(got_dw - dw) <= (N * (P + 2) + 1) * U * dw_mag + 1e-30)
    np.testing.assert_allclose(layer.blobs[1].diff, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)


# -- conv_cpu's blocked plan (lowered column blocks) ----------------------------------------------------

def _conv64(text, w, b, x, dy=None):
    """The same convolution in float64 (np.matmul, not the kernel): the reference, and with |w|, |x|, |dy|
    the magnitudes the bounds scale."""
    layer = make_layer("Convolution", text)
    bottom, top = blobs_from_arrays([x.astype(np.float64)], np.float64), empty_tops(1, np.float64)
    layer.SetUp(bottom, top)
    layer.blobs[0].data[...] = w
    if b is not None:
        layer.blobs[1].data[...] = b
    layer.Forward(bottom, top)
    if dy is None:
        return top[0].data.copy(), None, None
    top[0].diff[...] = dy
    layer.blobs[0].diff[...] = 0
    layer.Backward(top, [True], bottom)
    return top[0].data.copy(), bottom[0].diff.copy(), layer.blobs[0].diff.copy()


@NEEDS_AVX512
@settings(max_examples=12, deadline=None)
@given(N=st.integers(1, 3), cg=st.integers(1, 12), og=st.integers(1, 20), k=st.sampled_from([1, 3, 5]),
       stride=st.sampled_from([1, 2]), pad=st.integers(0, 2), HW=st.sampled_from([(5, 7), (9, 9), (30, 17)]),
       group=st.sampled_from([1, 2]), bias=st.booleans(), lowered=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_blocked_plan_with_the_kernel_within_the_float32_bounds(N, cg, og, k, stride, pad, HW, group, bias, lowered,
                                                                 seed):
    """The blocked plan's float32 forward and backward with kernels.gemm (GEMM512_LOWERED on; a padded layer or a
    1 x 1 kernel, and every layer's backward) and with np.matmul (off, and the forward of a valid layer with a
    larger kernel), each within the float32
    sum bounds of the float64 convolution: forward (K + 2) u (sum|w x| + |b|), K = kernel_dim; bottom diff
    (og + k^2 + 2) u sum|w dy| (the GEMM's og terms, then col2im's up to k^2 adds); weight diff
    (N P + 2 blocks + 2) u sum|dy x| (P positions an image, each block's sum added to the diff)."""
    if k == 1 and stride == 1 and pad == 0:
        stride = 2  # not the 1x1 plan
    C, Co = cg * group, og * group
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, *HW)).astype(np.float32)
    text = (f"convolution_param {{ num_output: {Co} kernel_size: {k} stride: {stride} pad: {pad} group: {group} "
            f"bias_term: {'true' if bias else 'false'} weight_filler {{ type: 'gaussian' std: 0.3 }} "
            "bias_filler { type: 'gaussian' std: 0.5 } }")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_cpu, "GEMM512", True)
        mp.setattr(conv_cpu, "GEMM512_LOWERED", lowered)
        mp.setattr(conv_cpu, "GEMM512_LOWERED_MIN_MACS", 0)
        mp.setattr(conv_cpu, "dense_fits", lambda layer, dtype: False)  # the blocked plan for every shape
        mp.setattr(conv_cpu, "direct_fits", lambda layer: False)
        counting = _Counting()
        mp.setattr(conv_cpu, "_gm", counting)
        layer = make_layer("Convolution", text)
        bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        forward_calls = counting.calls
        dy = rng.standard_normal(top[0].shape).astype(np.float32)
        top[0].diff[...] = dy
        layer.blobs[0].diff[...] = 0
        layer.Backward(top, [True], bottom)
        assert layer.plan(np, np.float32) == "blocked"
        blocks = len(layer.cpu_blocks(N, np.float32, exact=False).blocks)
        exact = conv_cpu._exact(layer, np.float32)  # the exact short-K forward: no GEMM of ours
    assert (forward_calls > 0) == (lowered and (pad > 0 or k == 1) and not exact)
    assert (counting.calls > forward_calls) == lowered  # the backward: every layer's (GEMM512_VALID_BACKWARD)
    w = layer.blobs[0].data.astype(np.float64)
    b = layer.blobs[1].data.astype(np.float64) if bias else None
    y, dx, dw = _conv64(text, w, b, x, dy)
    ym, dxm, dwm = _conv64(text, np.abs(w), None if b is None else np.abs(b), np.abs(x), np.abs(dy))
    K, P = layer.kernel_dim, int(np.prod(top[0].shape[2:]))
    assert np.all(np.abs(top[0].data - y) <= (K + 2) * U * ym + 1e-30)
    assert np.all(np.abs(bottom[0].diff - dx) <= (og + k * k + 2) * U * dxm + 1e-30)
    assert np.all(np.abs(layer.blobs[0].diff - dw) <= (N * P + 2 * blocks + 2) * U * dwm + 1e-30)


@NEEDS_AVX512
def test_blocked_plan_keeps_sgemm_for_valid_layers_forward(monkeypatch):
    """A valid (unpadded) convolution with a kernel past 1 x 1, LeNet's, keeps np.matmul in its forward with GEMM512
    on (the LeNet trace follows sgemm's sums there) and takes kernels.gemm in its backward (GEMM512_VALID_BACKWARD;
    off: np.matmul there too); a padded one takes kernels.gemm both ways, and so would a strided 1 x 1 but for its
    GEMMs' size (under GEMM512_LOWERED_MIN_MACS)."""
    monkeypatch.setattr(conv_cpu, "GEMM512", True)
    monkeypatch.setattr(conv_cpu, "GEMM512_LOWERED", True)
    monkeypatch.setattr(conv_cpu, "dense_fits", lambda layer, dtype: False)
    # the GEMMs here: 50 x 500 x 128 (valid), 50 x 500 x 288 (padded), 50 x 20 x 72 (1 x 1, stride 2) multiply-adds
    monkeypatch.setattr(conv_cpu, "GEMM512_LOWERED_MIN_MACS", 50 * 500 * 128)
    for text, valid_backward, forward, backward in (
            ("kernel_size: 5", True, False, True), ("kernel_size: 5", False, False, False),
            ("kernel_size: 5 pad: 2", True, True, True), ("kernel_size: 1 stride: 2", True, False, False)):
        monkeypatch.setattr(conv_cpu, "GEMM512_VALID_BACKWARD", valid_backward)
        counting = _Counting()
        monkeypatch.setattr(conv_cpu, "_gm", counting)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 50 {text} "
                           "weight_filler { type: 'gaussian' std: 0.1 } }")
        x = np.random.default_rng(0).standard_normal((2, 20, 12, 12)).astype(np.float32)
        bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        forward_calls = counting.calls
        top[0].diff[...] = 1
        layer.Backward(top, [True], bottom)
        assert layer.plan(np, np.float32) == "blocked", text
        assert (forward_calls > 0) == forward and (counting.calls > forward_calls) == backward, (text, valid_backward)


class _Buffers:
    """The one method of a layer _wgrad512 uses: a named scratch array."""

    def buffer(self, xp, name, shape, dtype):
        return xp.full(shape, np.nan, dtype)  # (NaN: a value read before it is written shows)


@NEEDS_AVX512
@settings(max_examples=25)
@given(og=st.integers(1, 100), kd=st.integers(1, 70), K=st.sampled_from([1, 5, 48, 385, 600, 1100]),
       strided=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_weight_diff_transposed_gives_the_plain_bits(og, kd, K, strided, seed):
    """conv_cpu._wgrad512 computes a narrow weight diff as col @ rows^T (WGRAD512_SWAP_MAX_OG / _MIN_K): the same
    chain of FMAs per element as rows @ col^T, so the same bits, accumulated onto the old diff; rows may be a band
    of dout's positions (a strided view), as blocked_backward passes it for one image."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((og, 2 * K if strided else K)).astype(np.float32)[:, :K]
    col = rng.standard_normal((kd, K)).astype(np.float32)
    wd = rng.standard_normal((og, kd)).astype(np.float32)
    plain = wd.copy()
    gm.gemm(rows, col.T, plain, None, 1)
    for max_og, min_k in ((conv_cpu.WGRAD512_SWAP_MAX_OG, conv_cpu.WGRAD512_SWAP_MIN_K), (100, 1)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_cpu, "WGRAD512_SWAP_MAX_OG", max_og)
            mp.setattr(conv_cpu, "WGRAD512_SWAP_MIN_K", min_k)
            got = wd.copy()
            conv_cpu._wgrad512(_Buffers(), rows, col, got)
        assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), (max_og, min_k)


class _Recording:
    """conv_cpu._gm with the shape of each gemm call's A recorded."""

    def __init__(self):
        self.a_shapes = []

    def gemm(self, a, *args):
        self.a_shapes.append(a.shape)
        return gm.gemm(a, *args)


@NEEDS_AVX512
def test_conv_weight_diff_same_bits_transposed_or_not(monkeypatch):
    """A LeNet-conv2-like layer (og 50, K = N P = 2 x 576) with the transposed weight diff on and off: the same
    weight diff, bit for bit, and the transposed path is the one taken where the rule says."""
    monkeypatch.setattr(conv_cpu, "GEMM512", True)
    monkeypatch.setattr(conv_cpu, "GEMM512_LOWERED", True)
    monkeypatch.setattr(conv_cpu, "GEMM512_LOWERED_MIN_MACS", 0)
    monkeypatch.setattr(conv_cpu, "dense_fits", lambda layer, dtype: False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 20, 28, 28)).astype(np.float32)
    dy = rng.standard_normal((2, 50, 24, 24)).astype(np.float32)
    diffs = []
    for max_og in (0, 96):
        monkeypatch.setattr(conv_cpu, "WGRAD512_SWAP_MAX_OG", max_og)
        layer = make_layer("Convolution", "convolution_param { num_output: 50 kernel_size: 5 "
                           "weight_filler { type: 'gaussian' std: 0.1 } }")
        bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.blobs[0].data[...] = np.random.default_rng(4).standard_normal(layer.blobs[0].shape)
        layer.blobs[0].diff[...] = 0.5
        layer.Forward(bottom, top)
        top[0].diff[...] = dy
        recording = _Recording()
        monkeypatch.setattr(conv_cpu, "_gm", recording)
        layer.Backward(top, [True], bottom)
        assert layer.plan(np, np.float32) == "blocked"
        assert any(shape in ((500, 576), (500, 1152)) for shape in recording.a_shapes) == (max_og == 96), \
            recording.a_shapes  # (A: the column block, transposed; W^T (500, 50) is the bottom diff's)
        diffs.append(layer.blobs[0].diff.copy())
    assert np.array_equal(diffs[0].view(np.uint32), diffs[1].view(np.uint32))


@NEEDS_AVX512
@settings(max_examples=20)
@given(M=st.integers(1, 40), N=st.integers(1, 96), K=st.sampled_from([1, 15, 16, 17, 100, 384, 385, 900]),
       ta=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gemm_prefetch_of_a_read_in_place_changes_no_bits(M, N, K, ta, seed):
    """A read in place (N within two column panels: the direct kernels) is prefetched ahead in its rows
    (set_direct_prefetch); with it off, or far ahead past the arrays' ends, the bits are the same."""
    rng = np.random.default_rng(seed)
    a, b = layout(rng, (M, K), "t" if ta else "c"), layout(rng, (K, N), "c")
    bias = rng.standard_normal(M).astype(np.float32)
    outs = []
    old = gm.set_direct_prefetch(0)
    try:
        for floats in (0, old, 4096):
            gm.set_direct_prefetch(floats)
            c = np.full((M, N), np.nan, np.float32)
            gm.gemm(a, b, c, bias, 0, 1)
            outs.append(c)
    finally:
        gm.set_direct_prefetch(old)
    assert old > 0
    for c in outs[1:]:
        np.testing.assert_array_equal(c.view(np.uint32), outs[0].view(np.uint32))
    with pytest.raises(ValueError):
        gm.set_direct_prefetch(-1)
