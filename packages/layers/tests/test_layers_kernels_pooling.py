"""kernels.pooling against the layer's generic NumPy path (the GPU's code): MAX and AVE, forward and backward.

The layer runs the kernel when it is built (pooling._k) and the NumPy code otherwise; each property runs
both on the same blobs. MAX must agree bit for bit, argmax mask included: values come from a few integers
(ties everywhere, so the first maximum in row-major order is tested), sprinkled with -inf, -FLT_MAX and NaN
(never taken: Caffe's strict greater-than from -FLT_MAX). Shapes: tiny and odd ones, and a few large enough
for both threads and for the kernels' whole-plane fast paths (W a multiple of the stride, global pooling).
"""
import contextlib
import os
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import pooling
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

sys.path.insert(0, os.path.dirname(__file__))
from kernels_harness import BUILDS, build_module  # noqa: E402

FLT_MAX = float(np.finfo(np.float32).max)
DTYPES = st.sampled_from([np.float32, np.float64])
SEEDS = st.integers(0, 2**31 - 1)
# (N, C, H, W) past PARALLEL_MIN_WORK (32768): both threads; 56 / 112 even (3x3/2 rows tile), 55 odd.
BIG = [(2, 9, 56, 56), (1, 4, 112, 112), (2, 5, 55, 55), (1, 3, 57, 64)]


@contextlib.contextmanager
def _build(build):
    """The layer's CPU path runs kernels.pooling's `build` (base, avx2, avx512; a skip where this CPU cannot)."""
    saved = pooling._k
    pooling._k = build_module("pooling", build)
    try:
        yield pooling._k
    finally:
        pooling._k = saved


def _run(text, x, dy, dtype, kernel, n_top=1):
    saved = pooling._k
    if not kernel:
        pooling._k = None
    try:
        layer = make_layer("Pooling", text)
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(n_top, dtype)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        top[0].diff[...] = dy if dy is not None else np.random.default_rng(7).normal(size=top[0].shape)
        layer.Backward(top, [True], bottom)
        return [t.data.copy() for t in top], bottom[0].diff.copy()
    finally:
        pooling._k = saved


def _values(seed, shape, specials):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float64)  # ties on purpose
    if specials:
        flat = x.reshape(-1)
        for v in (-np.inf, -FLT_MAX, np.nan):
            flat[rng.integers(0, flat.size, max(1, flat.size // 50))] = v
    return x


@st.composite
def max_cases(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    if draw(st.booleans()):  # the nets' shapes: 3x3/2 (ResNet, GoogLeNet, CaffeNet), 3x3/1 pad 1, 2x2/2
        k, s, p = draw(st.sampled_from([((3, 3), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)),
                                        ((3, 3), (1, 1), (1, 1)), ((2, 2), (2, 2), (0, 0))]))
    else:
        s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        p = (draw(st.integers(0, k[0] - 1)), draw(st.integers(0, k[1] - 1)))
    if draw(st.integers(0, 4)) == 0:
        shape = draw(st.sampled_from(BIG))
    else:
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                 draw(st.integers(max(1, k[0] - 2 * p[0]), 13)), draw(st.integers(max(1, k[1] - 2 * p[1]), 13)))
    ceil = draw(st.booleans())
    text = (f"pooling_param {{ pool: MAX kernel_h: {k[0]} kernel_w: {k[1]} stride_h: {s[0]} stride_w: {s[1]} "
            f"pad_h: {p[0]} pad_w: {p[1]} round_mode: {'CEIL' if ceil else 'FLOOR'} }}")
    return shape, text


@pytest.mark.parametrize("build", BUILDS)
@given(case=max_cases(), dtype=DTYPES, seed=SEEDS, specials=st.booleans())
def test_max_pooling_kernel_matches_numpy(build, case, dtype, seed, specials):
    shape, text = case
    x = _values(seed, shape, specials)
    with _build(build):
        tops_k, dx_k = _run(text, x, None, dtype, True, n_top=2)
    tops_n, dx_n = _run(text, x, None, dtype, False, n_top=2)
    np.testing.assert_array_equal(tops_k[0], tops_n[0])  # values (NaN never taken: none in the tops)
    np.testing.assert_array_equal(tops_k[1], tops_n[1])  # Caffe's argmax: the first maximum
    np.testing.assert_allclose(dx_k, dx_n, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-6)


@given(shape=st.one_of(st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 9), st.integers(1, 9)),
                       st.sampled_from([(8, 64, 7, 7), (2, 33, 13, 13), (1, 5, 56, 56)])),
       dtype=DTYPES, seed=SEEDS)
@pytest.mark.parametrize("build", BUILDS)
def test_global_ave_pooling_kernel_matches_numpy(build, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 3 + 1
    dy = rng.normal(size=shape[:2] + (1, 1))
    text = "pooling_param { pool: AVE global_pooling: true }"
    with _build(build):
        (yk,), dxk = _run(text, x, dy, dtype, True)
    (yn,), dxn = _run(text, x, dy, dtype, False)
    tol = 2e-6 if dtype == np.float32 else 1e-13  # the sum's order differs from NumPy's
    np.testing.assert_allclose(yk, yn, rtol=tol, atol=tol * max(1.0, float(np.abs(x).max())))
    np.testing.assert_allclose(dxk, dxn, rtol=tol, atol=tol)


@given(k=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       hw=st.tuples(st.integers(1, 11), st.integers(1, 11)), planes=st.integers(1, 3), pads=st.data(),
       dtype=DTYPES, seed=SEEDS)
def test_ave_pooling_backward_kernel_is_caffes_order(k, s, hw, planes, pads, dtype, seed):
    """The AVE backward kernel adds each window's dy / pool size (one quotient per window) to its pixels in
    Caffe's order (ascending window), bit for bit the same as Caffe's loop in the same dtype."""
    p = (pads.draw(st.integers(0, k[0] - 1)), pads.draw(st.integers(0, k[1] - 1)))
    H, W = max(hw[0], k[0] - 2 * p[0]), max(hw[1], k[1] - 2 * p[1])
    PH, PW = (-(-(H + 2 * p[0] - k[0]) // s[0]) + 1, -(-(W + 2 * p[1] - k[1]) // s[1]) + 1)
    dy = np.random.default_rng(seed).normal(size=(planes, PH, PW)).astype(dtype)
    dx = np.full((planes, H, W), np.nan, dtype)
    pooling._k.ave_pool_backward(dy.reshape(-1), dx.reshape(-1), planes, H, W, PH, PW, k[0], k[1], s[0], s[1],
                                 p[0], p[1])
    ref = np.zeros((planes, H, W), dtype)
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's degenerate window past the edge: size 0
        for c, i, j in np.ndindex(planes, PH, PW):  # Caffe's Backward_cpu loop
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], H + p[0]), min(ws + k[1], W + p[1])
            share = dy[c, i, j] / dtype((he - hs) * (we - ws))
            ref[c, max(hs, 0):min(he, H), max(ws, 0):min(we, W)] += share
    np.testing.assert_array_equal(dx, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pooling_kernel_first_maximum_in_every_window_position(dtype):
    # All-equal planes: every window's first pixel (row-major, clipped to the image) is the argmax.
    text = "pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }"
    x = np.ones((1, 2, 56, 56))
    (_, mask), _ = _run(text, x, None, dtype, True, n_top=2)
    H = W = 56
    PH = PW = mask.shape[2]
    hs = np.maximum(np.arange(PH) * 2 - 1, 0)
    ws = np.maximum(np.arange(PW) * 2 - 1, 0)
    np.testing.assert_array_equal(mask[0, 1], hs[:, None] * W + ws[None, :])


# The AVX2 blocks of eight outputs (float32, pooling_avx2): rows of 8 to 20 windows, so every remainder of a
# row's last block (done as the block ending at the row's last window) and rows of exactly one block come
# up, for the horizontal 3x3/2 pass, the vertical 3-row pass, the clipped windows at the borders and the
# whole-window 2x2/2 rows (where H and W are even); ties and -inf / -FLT_MAX / NaN as in the property
# above. Every width is checked on every run. The AVX-512 build's blocks of sixteen (pooling_avx512): rows of
# 8 to 35 windows (8-15: its 8-wide blocks; 16-35: every remainder of a 16-block, rows of one and two blocks).
# The values-alone forward (its horizontal blocks and its vertical blocks of 8 / 16) against the masked one.
@pytest.mark.parametrize("build", ["avx2", "avx512"])
@pytest.mark.parametrize("k, s, p", [(3, 2, 0), (3, 2, 1), (3, 1, 1), (2, 2, 0)])
@pytest.mark.parametrize("specials", [False, True])
def test_max_pooling_eight_output_blocks_every_remainder(build, k, s, p, specials):
    widths = range(15, 42) if build == "avx2" else range(15, 72, 1 if s == 2 else 3)
    for i, w in enumerate(widths):
        x = _values(100 + w, (1, 2, 19 + i % 3, w), specials)
        text = f"pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} }}"
        with _build(build) as mod:
            tops_k, dx_k = _run(text, x, None, np.float32, True, n_top=2)
            # the values alone (a TEST-phase forward: its own horizontal and vertical blocks): the same bits
            (n, c, h, _), (ph, pw) = x.shape, tops_k[0].shape[2:]
            y_values = np.full(n * c * ph * pw, 7, np.float32)
            mod.max_pool_forward(x.astype(np.float32).reshape(-1), y_values, None, n * c, h, w, ph, pw, k, k, s, s,
                                 p, p)
            np.testing.assert_array_equal(_bits(y_values), _bits(tops_k[0].reshape(-1)), err_msg=f"width {w}")
        tops_n, dx_n = _run(text, x, None, np.float32, False, n_top=2)
        np.testing.assert_array_equal(tops_k[0], tops_n[0], err_msg=f"width {w}")
        np.testing.assert_array_equal(tops_k[1], tops_n[1], err_msg=f"width {w}")
        np.testing.assert_allclose(dx_k, dx_n, rtol=1e-6, atol=1e-6, err_msg=f"width {w}")


# -- MAX in a TEST-phase net: the values without the argmax, the argmax recomputed by a Backward --------

def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _values_signed_zeros(seed, shape, specials):
    x = _values(seed, shape, specials)
    zeros = np.flatnonzero(x.reshape(-1) == 0)
    x.reshape(-1)[zeros[::2]] = -0.0  # a tie of 0 and -0: the first one's sign must come out
    return x


@pytest.mark.parametrize("build", BUILDS)
@given(case=max_cases(), dtype=DTYPES, seed=SEEDS, specials=st.booleans())
def test_max_pooling_values_kernel_is_the_masked_kernels_values(build, case, dtype, seed, specials):
    shape, text = case
    layer = make_layer("Pooling", text)
    x = _values_signed_zeros(seed, shape, specials).astype(dtype)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    y, mask = np.empty(top[0].shape, dtype), np.empty(top[0].shape, np.int32)
    y_values = np.full(top[0].shape, 7, dtype)
    with _build(build):
        pooling.max_forward(np, layer.spec, x, y, mask)
        assert pooling.max_forward_values(np, layer.spec, x, y_values) == (pooling._k is not None)
    if pooling._k is not None:
        np.testing.assert_array_equal(_bits(y_values), _bits(y))


def _test_phase_layer(text, x, dtype):
    layer = make_layer("Pooling", text, phase=pooling_test_phase())
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    return layer, bottom, top


def pooling_test_phase():
    from caffe.proto import caffe_pb2
    return caffe_pb2.TEST


@given(case=max_cases(), dtype=DTYPES, seed=SEEDS, specials=st.booleans())
def test_max_pooling_test_phase_forward_then_backward_is_trains(case, dtype, seed, specials):
    # TRAIN keeps the argmax at every forward; TEST leaves it out until a Backward recomputes it from the
    # bottom. The same tops and the same bottom diff either way, even when a later in-place layer has
    # changed the top (the recomputation writes a scratch top, never the net's).
    shape, text = case
    x = _values_signed_zeros(seed, shape, specials)
    (y_train,), dx_train = _run(text, x, None, dtype, True, n_top=1)
    layer, bottom, top = _test_phase_layer(text, x, dtype)
    layer.Forward(bottom, top)
    assert layer.mask_state.stale == (pooling._k is not None)
    np.testing.assert_array_equal(_bits(top[0].data), _bits(y_train.astype(dtype)))
    top[0].data[...] = 0  # as an in-place ReLU / Dropout after the pooling might
    top[0].diff[...] = np.random.default_rng(7).normal(size=top[0].shape)
    layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dx_train)
    np.testing.assert_array_equal(top[0].data, 0)
    assert not layer.mask_state.stale


def test_max_pooling_test_phase_keeps_the_argmax_once_backward_ran():
    # After one Backward (pycaffe's saliency / deep-dream loops), every forward writes the argmax again:
    # a new bottom's backward must use the new bottom's argmax, and no recomputation is paid twice.
    text = "pooling_param { pool: MAX kernel_size: 3 stride: 2 }"
    a = _values(1, (1, 2, 9, 9), False)
    layer, bottom, top = _test_phase_layer(text, a, np.float32)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    layer.Backward(top, [True], bottom)
    b = _values(2, (1, 2, 9, 9), False)
    bottom[0].data[...] = b
    layer.Forward(bottom, top)
    assert not layer.mask_state.stale
    layer.Backward(top, [True], bottom)
    (_,), dx_b = _run(text, b, np.ones(top[0].shape), np.float32, True, n_top=1)
    np.testing.assert_array_equal(bottom[0].diff, dx_b)


def test_max_pooling_train_phase_and_mask_top_always_write_the_argmax():
    text = "pooling_param { pool: MAX kernel_size: 3 stride: 2 }"
    x = _values(3, (1, 2, 9, 9), False)
    train = make_layer("Pooling", text)
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    train.SetUp(bottom, top)
    train.Forward(bottom, top)
    assert not train.mask_state.stale
    test = make_layer("Pooling", text, phase=pooling_test_phase())
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(2, np.float32)
    test.SetUp(bottom, top)
    test.Forward(bottom, top)  # the mask top is an output: always written
    assert not test.mask_state.stale
    assert (top[1].data >= 0).all()


# -- MAX 3x3 / stride 2 with the argmax, float32: the one-pass kernel of the AVX2 / AVX-512 builds ---------------
# (caffe_pool_max_k3s2: blocks of 8 / 16 window columns down the rows, the shared row carried, columns outside the
# image as NaN lanes, rows of fewer than 8 / 16 windows by masked stores.) Against the layer's NumPy path, bit for
# bit: values (signed zeros: the first maximum's sign), argmax, and -1 / -FLT_MAX where a window takes nothing.

def _k3s2_reference(x, pad, ceil):
    """(y, mask) of MAX 3x3 / stride 2 by the layer's NumPy path (pooling._k None), and the PoolSpec and sizes."""
    _, _, H, W = x.shape
    spec = pooling.PoolSpec(pooling.MAX, (3, 3), (2, 2), pad)
    PH, PW = pooling.pooled_size(H, 3, 2, pad[0], ceil), pooling.pooled_size(W, 3, 2, pad[1], ceil)
    y, mask = np.empty(x.shape[:2] + (PH, PW), x.dtype), np.empty(x.shape[:2] + (PH, PW), np.int32)
    saved = pooling._k
    pooling._k = None
    try:
        pooling.max_forward(np, spec, x, y, mask)
    finally:
        pooling._k = saved
    return y, mask, spec


def _check_k3s2(mod, x, pad, ceil, what):
    y_ref, m_ref, spec = _k3s2_reference(x, pad, ceil)
    N, C, H, W = x.shape
    PH, PW = y_ref.shape[2:]
    y, mask = np.full(N * C * PH * PW, 7, x.dtype), np.full(N * C * PH * PW, 7, np.int32)
    mod.max_pool_forward(x.reshape(-1), y, mask, N * C, H, W, PH, PW, 3, 3, 2, 2, pad[0], pad[1])
    np.testing.assert_array_equal(_bits(y), _bits(y_ref.reshape(-1)), err_msg=what)
    np.testing.assert_array_equal(mask, m_ref.reshape(-1), err_msg=what)


@pytest.mark.parametrize("build", BUILDS)
@given(hw=st.tuples(st.integers(1, 40), st.integers(1, 75)), pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       ceil=st.booleans(), planes=st.integers(1, 3), dtype=DTYPES, seed=SEEDS, specials=st.booleans())
def test_max_pooling_3x3_stride2_kernel_matches_numpy(build, hw, pad, ceil, planes, dtype, seed, specials):
    # H x W from 1 (windows clipped on every side, pads 0-2 each way, even empty ones: -1 / -FLT_MAX) to rows of
    # 38 windows (two blocks of 16 and the last one overlapping); float64 runs the separable kernel, the reference's
    # other client
    H, W = max(hw[0], 3 - 2 * pad[0]), max(hw[1], 3 - 2 * pad[1])
    if pooling.pooled_size(H, 3, 2, pad[0], ceil) < 1 or pooling.pooled_size(W, 3, 2, pad[1], ceil) < 1:
        return
    x = _values_signed_zeros(seed, (1, planes, H, W), specials).astype(dtype)
    _check_k3s2(build_module("pooling", build), x, pad, ceil, f"{build} {H}x{W} pad {pad} ceil {ceil}")


@pytest.mark.parametrize("build", ["avx2", "avx512"])
def test_max_pooling_3x3_stride2_kernel_every_width_and_pad(build):
    # Every row width from 1 to 70 (PW 1-35: masked rows of 1-15 windows, one block, every remainder of a 16 / 8
    # block) at every pad pair with a padded side, ceil and floor; two planes of 5 rows (the carried row, a clipped
    # last window row). Deterministic: every width on every run.
    mod = build_module("pooling", build)
    rng = np.random.default_rng(5)
    for W in range(1, 71):
        for pad in ((0, 0), (1, 1), (2, 1), (0, 2)):
            for ceil in (True, False):
                H = 5 + W % 3
                if pooling.pooled_size(W, 3, 2, pad[1], ceil) < 1 or pooling.pooled_size(H, 3, 2, pad[0], ceil) < 1:
                    continue
                x = rng.integers(-3, 4, (1, 2, H, W)).astype(np.float32)
                x.reshape(-1)[rng.integers(0, x.size, 3)] = rng.choice([np.nan, -np.inf, -FLT_MAX, -0.0], 3)
                _check_k3s2(mod, x, pad, ceil, f"{build} W {W} pad {pad} ceil {ceil}")


def _scatter_reference(dy, mask, planes, HW, PHW):
    """Caffe's MAX backward: dx = 0, then dx[argmax] += dy in output order (indices outside the plane dropped)."""
    dx = np.zeros(planes * HW, dy.dtype)
    for p in range(planes):
        plane = dx[p * HW:(p + 1) * HW]
        for k in range(PHW):
            i = mask[p * PHW + k]
            if 0 <= i < HW:
                plane[i] = plane[i] + dy[p * PHW + k]
    return dx


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pooling_2x2_backward_rows_are_the_scatters_bits(build, dtype):
    """2x2 / stride 2 windows tiling the plane: the backward writes each output row's two image rows (float32 rows of
    8 and more outputs in the AVX2 / AVX-512 builds) instead of zeroing and scattering: the scatter's bits for every
    row width 1-40 (blocks of 8, the last one overlapping), dy with -0 (0 + -0 is +0), NaN and inf, and masks edited
    between forward and backward (an argmax in another window, -1, past the plane: that plane by the scatter)."""
    mod = build_module("pooling", build)
    rng = np.random.default_rng(5)
    for PW in range(1, 41):
        PH, planes = 1 + PW % 3, 3
        H, W = 2 * PH, 2 * PW
        x = rng.integers(-3, 4, planes * H * W).astype(dtype)  # ties: the first maximum
        y, mask = np.empty(planes * PH * PW, dtype), np.empty(planes * PH * PW, np.int32)
        mod.max_pool_forward(x, y, mask, planes, H, W, PH, PW, 2, 2, 2, 2, 0, 0)
        dy = rng.standard_normal(y.size).astype(dtype)
        dy[rng.integers(0, dy.size, 4)] = rng.choice([-0.0, np.nan, np.inf, -np.inf], 4)
        for edit in (None, "other window", "negative", "past the plane"):
            m = mask.copy()
            if edit == "other window":  # plane 1's first output takes plane 1's last pixel
                m[PH * PW] = H * W - 1
            elif edit == "negative":
                m[rng.integers(0, m.size)] = -1
            elif edit == "past the plane":
                m[-1] = H * W + 3
            dx = np.full(planes * H * W, 5, dtype)
            mod.max_pool_backward(dy, m, dx, planes, H * W, PH * PW, W, PW)
            want = _scatter_reference(dy, m, planes, H * W, PH * PW)
            np.testing.assert_array_equal(_bits(dx), _bits(want), err_msg=f"PW {PW}, mask edit {edit}")


def test_max_pooling_backward_drops_an_argmax_outside_the_plane():
    # A mask top edited between forward and backward (Caffe's backward reads the argmax back from it): an index past
    # the plane is dropped (it was written into the next plane's dx), a negative one skipped, as before.
    dy = np.array([1, 2, 3, 4, 10, 20, 30, 40], np.float32)
    mask = np.array([0, 9, -5, 0, 1, 2, 3, 3], np.int32)  # plane 0: 9 is past its 3 x 3
    dx = np.full(18, np.nan, np.float32)
    pooling._k.max_pool_backward(dy, mask, dx, 2, 9, 4)
    np.testing.assert_array_equal(dx, [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 20, 70, 0, 0, 0, 0, 0])


# -- global AVE forward: Caffe's sum order, bit for bit (the AVX-512 / AVX2 builds transpose 16 / 8 planes into lanes) --

def _caffe_global_ave(x):
    """(planes, HW) -> Caffe's AVE over each plane: 0 + x[0] + x[1] + ... in x's precision, then / HW."""
    acc = np.zeros(x.shape[0], x.dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf: NaN, as the kernel's
        for k in range(x.shape[1]):
            acc = acc + x[:, k]
        return acc / x.dtype.type(x.shape[1])


@pytest.mark.parametrize("build", BUILDS)
@given(planes=st.integers(1, 40), hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), dtype=DTYPES, seed=SEEDS,
       specials=st.booleans())
def test_global_ave_pooling_forward_is_caffes_sum_order(build, planes, hw, dtype, seed, specials):
    # planes 1-40: whole groups of 16 / 8 lanes and every remainder (those planes one at a time); H x W 1-81 values:
    # blocks of 16 / 8 and partial last blocks. Magnitudes spread over 1e-3..1e5 so that another order of the
    # additions changes bits; signed zeros (0 + -0 = +0, as from Caffe's 0 start), inf and NaN.
    mod = build_module("pooling", build)
    H, W = hw
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((planes, H * W)) * rng.choice([1e-3, 1.0, 1e5], (planes, H * W))).astype(dtype)
    if specials:
        x.reshape(-1)[rng.integers(0, x.size, 3)] = rng.choice([-0.0, np.inf, -np.inf, np.nan], 3)
    x[0] = -0.0  # a plane of negative zeros: +0
    y = np.full(planes, 7, dtype)
    mod.ave_pool_forward(x.reshape(-1), y, planes, H, W, 1, 1, H, W, 1, 1, 0, 0)
    np.testing.assert_array_equal(_bits(y), _bits(_caffe_global_ave(x)))


def test_global_ave_pooling_forward_is_caffes_sum_order_at_the_resnet_shape():
    # 8 x 2048 planes of 7 x 7 (ResNet-50's pool5), both threads: every build this CPU runs against the reference
    x = (np.random.default_rng(3).standard_normal((8 * 2048, 49)) * 10).astype(np.float32)
    want = _bits(_caffe_global_ave(x))
    ran = 0
    for build in BUILDS:
        try:
            mod = build_module("pooling", build)
        except pytest.skip.Exception:
            continue
        y = np.empty(8 * 2048, np.float32)
        mod.ave_pool_forward(x.reshape(-1), y, 8 * 2048, 7, 7, 1, 1, 7, 7, 1, 1, 0, 0)
        np.testing.assert_array_equal(_bits(y), want, err_msg=build)
        ran += 1
    assert ran >= 1
