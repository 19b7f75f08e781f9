"""Pooling: MAX / AVE / STOCHASTIC against Caffe's loops, output sizes, mask top, gradients, errors."""
import numpy as np
import pytest
from hypothesis import assume, example, given, strategies as st

from caffe.blob import context
from caffe.layers import LayerError, pooling
from caffe.layers.testing import (blobs_from_arrays, check_cpu_gpu_parity, check_layer_gradient, empty_tops,
                                  gpu_available, layer_param, make_layer, run_forward)

FLT_MAX = float(np.finfo(np.float32).max)


def caffe_pooled(size, k, s, p, ceil=True):
    """Caffe's PoolingLayer::Reshape, with float arithmetic as in the C++."""
    v = float(np.float32(size + 2 * p - k) / np.float32(s))
    out = int(np.ceil(v) if ceil else np.floor(v)) + 1
    if p and (out - 1) * s >= size + p:
        out -= 1
    return out


def caffe_pool(x, k, s, p, method, ceil=True):
    """Caffe's Forward_cpu loops (MAX and AVE): top and argmax mask."""
    N, C, H, W = x.shape
    PH, PW = caffe_pooled(H, k[0], s[0], p[0], ceil), caffe_pooled(W, k[1], s[1], p[1], ceil)
    y, mask = np.zeros((N, C, PH, PW)), np.full((N, C, PH, PW), -1)
    for n, c, i, j in np.ndindex(N, C, PH, PW):
        hs, ws = i * s[0] - p[0], j * s[1] - p[1]
        if method == "MAX":
            he, we = min(hs + k[0], H), min(ws + k[1], W)
            best = -FLT_MAX
            for h in range(max(hs, 0), he):
                for w in range(max(ws, 0), we):
                    if x[n, c, h, w] > best:
                        best, mask[n, c, i, j] = x[n, c, h, w], h * W + w
            y[n, c, i, j] = best
        else:
            he, we = min(hs + k[0], H + p[0]), min(ws + k[1], W + p[1])
            size = (he - hs) * (we - ws)
            he, we = min(he, H), min(we, W)
            y[n, c, i, j] = x[n, c, max(hs, 0):he, max(ws, 0):we].sum() / size
    return y, mask


def caffe_pool_backward(dy, mask, shape, k, s, p, method):
    N, C, H, W = shape
    dx = np.zeros(shape)
    for n, c, i, j in np.ndindex(*dy.shape):
        if method == "MAX":
            if mask[n, c, i, j] >= 0:
                dx[n, c].reshape(-1)[mask[n, c, i, j]] += dy[n, c, i, j]
        else:
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], H + p[0]), min(ws + k[1], W + p[1])
            size = (he - hs) * (we - ws)
            he, we = min(he, H), min(we, W)
            dx[n, c, max(hs, 0):he, max(ws, 0):we] += dy[n, c, i, j] / size
    return dx


@st.composite
def pool_cases(draw, max_side=7, methods=("MAX", "AVE"), padding=True, max_num=2, max_channels=3):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    method = draw(st.sampled_from(methods))
    ph, pw = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))) if padding else (0, 0)
    ceil = draw(st.booleans())
    H = draw(st.integers(max(1, kh - 2 * ph), max(1, kh - 2 * ph) + max_side))
    W = draw(st.integers(max(1, kw - 2 * pw), max(1, kw - 2 * pw) + max_side))
    shape = (draw(st.integers(1, max_num)), draw(st.integers(1, max_channels)), H, W)
    if draw(st.booleans()) and kh == kw:
        text = f"kernel_size: {kh} "
    else:
        text = f"kernel_h: {kh} kernel_w: {kw} "
    if sh == sw and draw(st.booleans()):
        text += f"stride: {sh} " if sh != 1 or draw(st.booleans()) else ""
    else:
        text += f"stride_h: {sh} stride_w: {sw} "
    if ph == pw and draw(st.booleans()):
        text += f"pad: {ph} " if ph or draw(st.booleans()) else ""
    else:
        text += f"pad_h: {ph} pad_w: {pw} "
    text += "" if ceil and draw(st.booleans()) else f"round_mode: {'CEIL' if ceil else 'FLOOR'} "
    return dict(shape=shape, k=(kh, kw), s=(sh, sw), p=(ph, pw), method=method, ceil=ceil,
                text=f"pooling_param {{ pool: {method} {text}}}", seed=draw(st.integers(0, 2**31 - 1)))


def _distinct(seed, shape):
    """Values with distinct magnitudes (no ties for MAX, no kinks for the gradient check)."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) / 7.0 - 1.0


def _forward_backward(text, x, dy, dtype=np.float64, n_top=1):
    layer = make_layer("Pooling", text)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(n_top, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = dy
    layer.Backward(top, [True], bottom)
    return [t.data.copy() for t in top], bottom[0].diff.copy()


def _case(method, shape, k, s, p, ceil, params, seed):
    return dict(shape=shape, k=k, s=s, p=p, method=method, ceil=ceil, seed=seed,
                text=f"pooling_param {{ pool: {method} {params} }}")


# Padding on both paths (the Cython kernels and the generic code the GPU runs): AVE's divisor counts the
# padded extent, so a padded AVE window at the edge tells the paths apart from a plain mean; asymmetric
# kernels, strides and pads, FLOOR rounding, and a last window that starts in the padding (5 + 2 - 3 / 2).
_AVE_SQUARE = _case("AVE", (2, 2, 5, 6), (3, 3), (2, 2), (1, 1), True, "kernel_size: 3 stride: 2 pad: 1", 41)
_AVE_ASYM = _case("AVE", (1, 2, 4, 7), (3, 4), (1, 3), (2, 1), False,
                  "kernel_h: 3 kernel_w: 4 stride_h: 1 stride_w: 3 pad_h: 2 pad_w: 1 round_mode: FLOOR", 42)
_MAX_PAD = _case("MAX", (1, 2, 5, 5), (3, 3), (2, 2), (2, 2), True, "kernel_size: 3 stride: 2 pad: 2", 43)


@given(case=pool_cases(), dtype=st.sampled_from([np.float64, np.float32]), generic=st.booleans())
@example(case=_AVE_SQUARE, dtype=np.float64, generic=False)
@example(case=_AVE_SQUARE, dtype=np.float64, generic=True)
@example(case=_AVE_ASYM, dtype=np.float32, generic=False)
@example(case=_AVE_ASYM, dtype=np.float32, generic=True)
@example(case=_MAX_PAD, dtype=np.float64, generic=False)
@example(case=_MAX_PAD, dtype=np.float64, generic=True)
def test_pooling_matches_caffe_loops(case, dtype, generic):
    x = np.random.default_rng(case["seed"]).normal(size=case["shape"])
    x = x.astype(dtype).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # Caffe's 0/0 for a window past the edge
        ref, mask = caffe_pool(x, case["k"], case["s"], case["p"], case["method"], case["ceil"])
        dy = np.random.default_rng(case["seed"] + 1).normal(size=ref.shape).astype(dtype).astype(np.float64)
        dref = caffe_pool_backward(dy, mask, x.shape, case["k"], case["s"], case["p"], case["method"])
    saved = pooling._k
    if generic:  # the array-module-generic path (the GPU's) on NumPy
        pooling._k = None
    try:
        n_top = 2 if case["method"] == "MAX" else 1
        tops, dx = _forward_backward(case["text"], x, dy, dtype, n_top)
    finally:
        pooling._k = saved
    tol = 1e-12 if dtype == np.float64 else 1e-5
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(tops[0], ref, rtol=tol, atol=tol)  # nan where Caffe divides 0 by 0
        np.testing.assert_allclose(dx, dref, rtol=tol, atol=tol)
    if n_top == 2:
        np.testing.assert_array_equal(tops[1], mask)


def _windows_overlap_image(case):
    """False in Caffe's degenerate case (stride > kernel, no pad): a window past the image edge."""
    N, C, H, W = case["shape"]
    return all((caffe_pooled(n, k, s, p, case["ceil"]) - 1) * s - p < n
               for n, k, s, p in zip((H, W), case["k"], case["s"], case["p"]))


@given(case=pool_cases(max_side=3, max_num=1, max_channels=2))
def test_pooling_gradient(case):
    assume(_windows_overlap_image(case))  # else Caffe's AVE divides by zero (nan), MAX has no argmax
    x = _distinct(case["seed"], case["shape"])
    check_layer_gradient(make_layer("Pooling", case["text"]), [x], mode="exhaustive", stepsize=1e-3)


def test_global_pooling_gradient_and_shape():
    x = _distinct(0, (2, 3, 4, 5))
    for method in ("MAX", "AVE"):
        layer = make_layer("Pooling", f"pooling_param {{ pool: {method} global_pooling: true }}")
        _, top = run_forward(layer, [x])
        assert top[0].shape == (2, 3, 1, 1)
        expect = x.max(axis=(2, 3)) if method == "MAX" else x.mean(axis=(2, 3))
        np.testing.assert_allclose(top[0].data[:, :, 0, 0], expect, rtol=1e-12)
        check_layer_gradient(make_layer("Pooling", f"pooling_param {{ pool: {method} global_pooling: true }}"),
                             [x[:1, :2]], mode="exhaustive")


# -- output sizes (Caffe's documented formula) ------------------------------------------------

@pytest.mark.parametrize("size,k,s,p,ceil,expect", [
    (6, 3, 2, 0, True, 3),    # ceil(3 / 2) + 1
    (6, 3, 2, 0, False, 2),   # floor(3 / 2) + 1
    (6, 3, 2, 1, True, 4),    # ceil(5 / 2) + 1; the last window starts at 6 - 1 = 5 < 6 + 1: kept
    (6, 3, 2, 1, False, 3),
    (5, 2, 2, 1, True, 3),    # ceil(5 / 2) + 1 = 4, but (4 - 1) * 2 = 6 >= 5 + 1: clipped to 3
    (5, 2, 2, 1, False, 3),
    (13, 3, 2, 0, True, 6),   # CaffeNet pool5
    (55, 3, 2, 0, True, 27),  # CaffeNet pool1
    (24, 2, 2, 0, True, 12),  # LeNet pool1
    (32, 3, 2, 0, True, 16),  # CIFAR10-quick pool1 (ceil(14.5) + 1)
    (32, 3, 2, 0, False, 15),
])
def test_pooled_size(size, k, s, p, ceil, expect):
    assert pooling.pooled_size(size, k, s, p, ceil) == expect == caffe_pooled(size, k, s, p, ceil)
    mode = "CEIL" if ceil else "FLOOR"
    layer = make_layer("Pooling", f"pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} "
                                  f"round_mode: {mode} }}")
    _, top = run_forward(layer, [np.zeros((1, 1, size, size))])
    assert top[0].shape == (1, 1, expect, expect)


def test_caffenet_pool5_shape():
    layer = make_layer("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }")
    _, top = run_forward(layer, [np.zeros((2, 256, 13, 13))])
    assert top[0].shape == (2, 256, 6, 6)


def test_max_pooling_mask_top_values():
    # Caffe's TestForwardMax layout: 3x5 input, 2x2 kernel, stride 1 -> 2x4 output.
    x = np.array([[1, 2, 5, 2, 3],
                  [9, 4, 1, 4, 8],
                  [1, 2, 5, 2, 3]], dtype=np.float64).reshape(1, 1, 3, 5)
    layer = make_layer("Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 1 }")
    _, top = run_forward(layer, [x], n_top=2)
    np.testing.assert_array_equal(top[0].data[0, 0], [[9, 5, 5, 8], [9, 5, 5, 8]])
    np.testing.assert_array_equal(top[1].data[0, 0], [[5, 2, 2, 9], [5, 12, 12, 9]])
    # backward reads the argmax back from the mask top, as Caffe does
    top[0].diff[...] = 1
    bottom = blobs_from_arrays([x])
    layer.Forward(bottom, top)
    top[1].data[0, 0, 0, 0] = 0  # redirect one window's gradient to pixel 0
    layer.Backward(top, [True], bottom)
    assert bottom[0].diff[0, 0, 0, 0] == 1 and bottom[0].diff[0, 0, 1, 0] == 1


def test_ave_pooling_padded_divisor():
    # 3x3 of ones, kernel 3, stride 1, pad 1: the corner window covers 2x2 pixels but divides by
    # the 3x3 window clipped to the padded extent (h + pad): 9 -> 4/9; the edge: 6/9; the centre 1.
    layer = make_layer("Pooling", "pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 }")
    _, top = run_forward(layer, [np.ones((1, 1, 3, 3))])
    np.testing.assert_allclose(top[0].data[0, 0], [[4 / 9, 6 / 9, 4 / 9], [6 / 9, 1, 6 / 9], [4 / 9, 6 / 9, 4 / 9]])
    # 4x4, kernel 3, stride 2, pad 1 (pooled 3): the last window starts at 3, is clipped to the padded
    # extent [3, 5) (2 rows) for the divisor, then to the image [3, 4) (1 row) for the sum.
    layer = make_layer("Pooling", "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }")
    _, top = run_forward(layer, [np.ones((1, 1, 4, 4))])
    np.testing.assert_allclose(top[0].data[0, 0], [[4 / 9, 6 / 9, 2 / 6], [6 / 9, 1, 3 / 6], [2 / 6, 3 / 6, 1 / 4]])


# -- STOCHASTIC ---------------------------------------------------------------------------------

@given(case=pool_cases(methods=("STOCHASTIC",), padding=False), phase=st.sampled_from([0, 1]))
def test_stochastic_pooling(case, phase):
    x = np.random.default_rng(case["seed"]).uniform(0.1, 1.0, size=case["shape"])
    context.set_random_seed(case["seed"])
    layer = make_layer("Pooling", case["text"], phase=phase)
    bottom, top = run_forward(layer, [x])
    y = top[0].data
    k, s = case["k"], case["s"]
    N, C, H, W = x.shape
    assert y.shape == (N, C, caffe_pooled(H, k[0], s[0], 0, case["ceil"]), caffe_pooled(W, k[1], s[1], 0, case["ceil"]))
    for n, c, i, j in np.ndindex(*y.shape):
        win = x[n, c, i * s[0]:min(i * s[0] + k[0], H), j * s[1]:min(j * s[1] + k[1], W)]
        if win.size == 0:
            continue
        if phase == 0:  # TRAIN: one of the window's values
            assert y[n, c, i, j] in win
        else:  # TEST: the probability-weighted average
            np.testing.assert_allclose(y[n, c, i, j], (win ** 2).sum() / win.sum(), rtol=1e-12)
    if phase == 0:  # backward routes each top diff to the sampled element
        top[0].diff[...] = 1
        layer.Backward(top, [True], bottom)
        dx = bottom[0].diff
        assert dx.sum() == pytest.approx(sum(
            1 for n, c, i, j in np.ndindex(*y.shape)
            if i * s[0] < H and j * s[1] < W))
        chosen = x[dx > 0]
        assert set(np.round(chosen, 12)) <= set(np.round(y.ravel(), 12))


def test_stochastic_train_samples_in_proportion_to_activation():
    x = np.array([1.0, 3.0]).reshape(1, 1, 1, 2)
    counts = np.zeros(2)
    context.set_random_seed(1701)
    layer = make_layer("Pooling", "pooling_param { pool: STOCHASTIC kernel_h: 1 kernel_w: 2 }", phase=0)
    bottom, top = blobs_from_arrays([x]), empty_tops(1)
    layer.SetUp(bottom, top)
    for _ in range(400):
        layer.Forward(bottom, top)
        counts[int(top[0].data.ravel()[0] == 3.0)] += 1
    assert 0.68 < counts[1] / counts.sum() < 0.82  # p = 3/4


def test_stochastic_is_reproducible_under_the_seed():
    x = np.random.default_rng(0).uniform(0, 1, size=(2, 2, 6, 6))
    outs = []
    for _ in range(2):
        context.set_random_seed(42)
        layer = make_layer("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }", phase=0)
        _, top = run_forward(layer, [x])
        outs.append(top[0].data.copy())
    np.testing.assert_array_equal(*outs)


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,shape,match", [
    ("pooling_param { pool: MAX kernel_size: 2 pad: 2 }", (1, 1, 4, 4), r"pad \(2, 2\) must be smaller than the kernel"),
    ("pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 2 }", (1, 1, 4, 4), r"must be smaller"),
    ("pooling_param { pool: MAX kernel_size: 0 }", (1, 1, 4, 4), r"Filter dimensions cannot be zero"),
    ("pooling_param { pool: MAX kernel_size: 2 kernel_h: 2 kernel_w: 2 }", (1, 1, 4, 4),
     r"kernel_size OR kernel_h and kernel_w; not both"),
    ("pooling_param { pool: MAX kernel_h: 2 }", (1, 1, 4, 4), r"both kernel_h and kernel_w \(for non-square"),
    ("pooling_param { pool: MAX }", (1, 1, 4, 4), r"pooling_param needs kernel_size, or both kernel_h and kernel_w"),
    ("pooling_param { pool: MAX kernel_size: 2 pad: 1 pad_h: 1 pad_w: 1 }", (1, 1, 4, 4), r"pad is pad OR pad_h"),
    ("pooling_param { pool: MAX kernel_size: 2 stride_h: 1 }", (1, 1, 4, 4), r"Stride is stride OR stride_h"),
    ("pooling_param { pool: MAX kernel_size: 2 stride: 0 }", (1, 1, 4, 4), r"stride must be nonzero"),
    ("pooling_param { pool: STOCHASTIC kernel_size: 3 pad: 1 }", (1, 1, 4, 4),
     r"Padding implemented only for average and max pooling"),
    ("pooling_param { pool: MAX global_pooling: true kernel_size: 2 }", (1, 1, 4, 4),
     r"With Global_pooling: true Filter size cannot specified"),
    ("pooling_param { pool: MAX global_pooling: true stride: 2 }", (1, 1, 4, 4),
     r"With Global_pooling: true; only pad = 0 and stride = 1"),
    ("pooling_param { pool: MAX kernel_size: 2 }", (1, 4, 4), r"Input must have 4 axes"),
    ("pooling_param { pool: MAX kernel_size: 5 }", (1, 1, 3, 3), r"pooled output size"),
    # the boundaries: pad equal to the kernel, one of a pair given alone, an output of 0 on one axis only
    ("pooling_param { pool: AVE kernel_size: 2 pad: 2 }", (1, 1, 4, 4), r"must be smaller"),
    ("pooling_param { pool: MAX kernel_h: 2 kernel_w: 3 pad_h: 2 pad_w: 1 }", (1, 1, 4, 4), r"must be smaller"),
    ("pooling_param { pool: MAX kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 2 }", (1, 1, 4, 4), r"must be smaller"),
    ("pooling_param { pool: MAX kernel_size: 2 kernel_h: 2 }", (1, 1, 4, 4), r"kernel_size OR kernel_h and kernel_w"),
    ("pooling_param { pool: MAX global_pooling: true kernel_h: 2 }", (1, 1, 4, 4),
     r"With Global_pooling: true Filter size cannot specified"),
    ("pooling_param { pool: MAX kernel_size: 3 pad_h: 1 }", (1, 1, 4, 4), r"pad is pad OR pad_h"),
    ("pooling_param { pool: MAX kernel_h: 4 kernel_w: 1 }", (1, 1, 3, 3), r"pooled output size 0x3"),
    ("pooling_param { pool: MAX kernel_h: 1 kernel_w: 4 }", (1, 1, 3, 3), r"pooled output size 3x0"),
])
def test_bad_parameters_name_the_layer_and_field(text, shape, match):
    layer = make_layer("Pooling", text, name="pool")
    with pytest.raises(LayerError, match=r"Layer 'pool' \(Pooling\).*" + match):
        run_forward(layer, [np.ones(shape)])


def test_mask_top_only_for_max():
    layer = make_layer("Pooling", "pooling_param { pool: AVE kernel_size: 2 }", name="p")
    with pytest.raises(LayerError, match=r"Layer 'p' \(Pooling\): only MAX pooling has a second"):
        run_forward(layer, [np.ones((1, 1, 4, 4))], n_top=2)
    with pytest.raises(LayerError, match="at most 2 top"):
        run_forward(make_layer("Pooling", "pooling_param { pool: MAX kernel_size: 2 }"), [np.ones((1, 1, 4, 4))],
                    n_top=3)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
@pytest.mark.parametrize("text", ["pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }",
                                  "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }",
                                  "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }"])
def test_cpu_gpu_parity(text):
    x = np.random.default_rng(0).uniform(0.1, 1, size=(2, 3, 7, 6))
    phase = 1 if "STOCHASTIC" in text else 0
    check_cpu_gpu_parity(layer_param("Pooling", text, phase=phase), [x], rtol=1e-5, atol=1e-6)


@given(n=st.integers(1, 3), c=st.integers(1, 3), h=st.integers(1, 6), w=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([np.float32, np.float64]))
def test_max_2x2_stride_2_fast_path_matches_caffe_with_ties(n, c, h, w, seed, dtype):
    """LeNet's pooling (2x2, stride 2, no pad, even sides) has its own kernel: same values, same argmax
    (the first maximum in row-major order wins ties) and same backward as Caffe's loops."""
    shape = (n, c, 2 * h, 2 * w)
    x = np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float64)  # many ties
    ref, mask = caffe_pool(x, (2, 2), (2, 2), (0, 0), "MAX", True)
    dy = np.random.default_rng(seed + 1).normal(size=ref.shape).astype(dtype).astype(np.float64)
    dref = caffe_pool_backward(dy, mask, x.shape, (2, 2), (2, 2), (0, 0), "MAX")
    tops, dx = _forward_backward("pooling_param { pool: MAX kernel_size: 2 stride: 2 }", x, dy, dtype, 2)
    np.testing.assert_array_equal(tops[0], ref)
    np.testing.assert_array_equal(tops[1], mask)
    np.testing.assert_allclose(dx, dref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("k, s, p, ceil", [(3, 2, 1, True), (2, 3, 1, False)])
def test_max_ties_pick_the_first_maximum_on_both_paths(generic, k, s, p, ceil):
    """As Caffe's loops (a strictly greater value replaces the best): of equal maxima the first in row-major
    order is the argmax, with general windows on the kernels and the generic path: 3x3 stride 2 pad 1, and
    FLOOR rounding with the stride past the pad (the last window stops short of the padded edge)."""
    x = np.random.default_rng(5).integers(-1, 2, size=(2, 2, 5, 5)).astype(np.float64)  # many ties
    ref, mask = caffe_pool(x, (k, k), (s, s), (p, p), "MAX", ceil)
    dy = np.random.default_rng(6).normal(size=ref.shape)
    dref = caffe_pool_backward(dy, mask, x.shape, (k, k), (s, s), (p, p), "MAX")
    text = f"pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} round_mode: {'CEIL' if ceil else 'FLOOR'} }}"
    saved = pooling._k
    if generic:
        pooling._k = None
    try:
        tops, dx = _forward_backward(text, x, dy, n_top=2)
    finally:
        pooling._k = saved
    np.testing.assert_array_equal(tops[0], ref)
    np.testing.assert_array_equal(tops[1], mask)
    np.testing.assert_allclose(dx, dref, rtol=1e-12)


@pytest.mark.parametrize("uniform, expect", [(0.0, 0), (0.1, 1), (0.25, 1), (0.5, 2), (0.75, 3), (1.0, 3)])
def test_stochastic_train_takes_the_first_cumulative_sum_reaching_the_draw(uniform, expect):
    """Caffe's StoPoolForwardTrain picks the first element whose cumulative sum is >= draw * window sum:
    a draw landing exactly on a cumulative sum takes that element, a draw of 0 the first (even a 0)."""
    x = np.array([0.0, 1.0, 1.0, 2.0]).reshape(1, 1, 2, 2)  # cumulative sums 0, 1, 2, 4
    spec = pooling.PoolSpec(pooling.STOCHASTIC, (2, 2), (1, 1), (0, 0))
    y, idx = np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1), np.int32)
    pooling.stochastic_forward_train(np, spec, x, y, idx, np.full((1, 1, 1, 1), uniform))
    assert idx.item() == expect and y.item() == x.ravel()[expect]
