"""SPP: Caffe's pyramid (per-level pooling, flatten, concat) against a direct reference; gradients; errors."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from caffe.blob import context
from caffe.layers import LayerError
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

FLT_MAX = float(np.finfo(np.float32).max)


def level_pooling(x, level, method):
    """Caffe's GetPoolingParam for a level, then its pooling loops (CEIL rounding)."""
    N, C, H, W = x.shape
    bins = 2 ** level
    k = (math.ceil(H / bins), math.ceil(W / bins))
    p = ((k[0] * bins - H + 1) // 2, (k[1] * bins - W + 1) // 2)
    out = []
    for n_, kk, pp in zip((H, W), k, p):
        o = math.ceil((n_ + 2 * pp - kk) / kk) + 1
        if pp and (o - 1) * kk >= n_ + pp:
            o -= 1
        out.append(o)
    y = np.zeros((N, C) + tuple(out))
    for n, c, i, j in np.ndindex(*y.shape):
        hs, ws = i * k[0] - p[0], j * k[1] - p[1]
        if method == "MAX":
            win = x[n, c, max(hs, 0):min(hs + k[0], H), max(ws, 0):min(ws + k[1], W)]
            y[n, c, i, j] = win.max() if win.size else -FLT_MAX
        else:
            he, we = min(hs + k[0], H + p[0]), min(ws + k[1], W + p[1])
            size = (he - hs) * (we - ws)
            y[n, c, i, j] = x[n, c, max(hs, 0):min(he, H), max(ws, 0):min(we, W)].sum() / size
    return y


def ref_spp(x, height, method):
    if height == 1:
        return level_pooling(x, 0, method)
    return np.concatenate([level_pooling(x, lv, method).reshape(x.shape[0], -1) for lv in range(height)], axis=1)


@st.composite
def spp_cases(draw, max_side=9):
    height = draw(st.integers(1, 3))
    lo = 2 ** (height - 1)  # every level needs pad < kernel: at least bins pixels
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(lo, lo + max_side)),
             draw(st.integers(lo, lo + max_side)))
    method = draw(st.sampled_from(["MAX", "AVE"]))
    return dict(height=height, shape=shape, method=method, seed=draw(st.integers(0, 2**31 - 1)),
                text=f"spp_param {{ pyramid_height: {height} pool: {method} }}")


def _ok(shape, height):
    """Caffe's pooling checks pad < kernel at every level."""
    for lv in range(height):
        bins = 2 ** lv
        for n in shape[2:]:
            k = math.ceil(n / bins)
            if (k * bins - n + 1) // 2 >= k and (k * bins - n + 1) // 2 > 0:
                return False
    return True


@given(case=spp_cases())
def test_spp_matches_pooling_flatten_concat(case):
    assume(_ok(case["shape"], case["height"]))
    x = np.random.default_rng(case["seed"]).normal(size=case["shape"])
    _, top = run_forward(make_layer("SPP", case["text"]), [x])
    ref = ref_spp(x, case["height"], case["method"])
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-15)  # sums near zero: absolute


@given(case=spp_cases(max_side=2))
def test_spp_gradient(case):
    assume(_ok(case["shape"], case["height"]))
    shape = (1, min(case["shape"][1], 2)) + case["shape"][2:]
    x = np.random.default_rng(case["seed"]).permutation(np.arange(np.prod(shape), dtype=float)).reshape(shape) / 5
    check_layer_gradient(make_layer("SPP", case["text"]), [x], mode="single")


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_spp_gradient_exhaustive(method):
    x = np.random.default_rng(2).permutation(np.arange(2 * 5 * 3, dtype=float)).reshape(1, 2, 5, 3) / 5
    check_layer_gradient(make_layer("SPP", f"spp_param {{ pyramid_height: 2 pool: {method} }}"), [x],
                         mode="exhaustive")


def test_caffe_setup_shapes():
    # Caffe's TestSetup: 2x3x9x8 bottom, pyramid_height 3 -> 2 x (3 * (1 + 4 + 16)) = 2 x 63
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 3 }"), [np.ones((2, 3, 9, 8))])
    assert top[0].shape == (2, 63)
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 1 }"), [np.ones((2, 3, 9, 8))])
    assert top[0].shape == (2, 3, 1, 1)  # a single level is the pooling output itself
    # Caffe's TestEqualOutputDims2: 10x3x7x7, pyramid_height 3 -> 3 * 21 = 63 per image
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 3 }"), [np.ones((10, 3, 7, 7))])
    assert top[0].shape == (10, 63)


def test_reshape_recomputes_levels():
    layer = make_layer("SPP", "spp_param { pyramid_height: 2 pool: AVE }")
    bottom, top = run_forward(layer, [np.ones((1, 2, 4, 4))])
    bottom[0].reshape(1, 2, 7, 5)
    bottom[0].data[...] = np.random.default_rng(0).normal(size=(1, 2, 7, 5))
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, ref_spp(bottom[0].data, 2, "AVE"), rtol=1e-12)


def test_stochastic_spp_train_picks_window_values():
    x = np.random.default_rng(1).uniform(0.1, 1, size=(1, 2, 4, 4))
    context.set_random_seed(3)
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 3 pool: STOCHASTIC }", phase=0), [x])
    assert top[0].shape == (1, 2 * 21)
    assert np.isin(top[0].data, x).all()


@pytest.mark.parametrize("text,shape,match", [
    ("spp_param { pyramid_height: 4 }", (1, 1, 5, 5), r"too small for spp_param.pyramid_height 4"),
    ("spp_param { pyramid_height: 0 }", (1, 1, 5, 5), r"spp_param.pyramid_height must be positive"),
    ("spp_param { pyramid_height: 2 pool: STOCHASTIC }", (1, 1, 5, 5), r"implemented only for MAX and AVE"),
    ("spp_param { pyramid_height: 2 }", (1, 5, 5), r"Input must have 4 axes"),
])
def test_bad_parameters_name_the_layer_and_field(text, shape, match):
    with pytest.raises(LayerError, match=r"Layer 'spp' \(SPP\): .*" + match):
        run_forward(make_layer("SPP", text, name="spp"), [np.ones(shape)])


def _windows(x, level):
    """(N, C, PH, PW, k*k) windows of a level without padding (STOCHASTIC needs none), row-major inside."""
    N, C, H, W = x.shape
    bins = 2 ** level
    kh, kw = math.ceil(H / bins), math.ceil(W / bins)
    PH, PW = H // kh, W // kw
    return x[:, :, :PH * kh, :PW * kw].reshape(N, C, PH, kh, PW, kw).transpose(0, 1, 2, 4, 3, 5).reshape(
        N, C, PH, PW, kh * kw)


def test_stochastic_spp_follows_caffes_sampling_and_test_time_average():
    x = np.random.default_rng(1).uniform(0.1, 1, size=(2, 2, 4, 4))
    context.set_random_seed(3)
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 3 pool: STOCHASTIC }", phase=0), [x])
    # TRAIN: per level, one uniform u per window; the first element whose running sum reaches u * sum
    context.set_random_seed(3)
    want = []
    for level in range(3):
        win = _windows(x, level)
        u = context.rng().random(win.shape[:4])
        cums = np.cumsum(win, axis=-1)
        first = np.argmax(cums >= (u * cums[..., -1])[..., None], axis=-1)
        want.append(np.take_along_axis(win, first[..., None], axis=-1)[..., 0].reshape(2, -1))
    np.testing.assert_allclose(top[0].data, np.concatenate(want, axis=1), rtol=1e-12)
    # TEST: the activation-weighted average sum(x^2) / sum(x) of each window
    _, top = run_forward(make_layer("SPP", "spp_param { pyramid_height: 2 pool: STOCHASTIC }", phase=1), [x])
    want = [((w * w).sum(-1) / w.sum(-1)).reshape(2, -1) for w in (_windows(x, 0), _windows(x, 1))]
    np.testing.assert_allclose(top[0].data, np.concatenate(want, axis=1), rtol=1e-12)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_spp_on_a_non_square_input(method):
    x = np.random.default_rng(5).normal(size=(2, 3, 7, 12))
    _, top = run_forward(make_layer("SPP", f"spp_param {{ pyramid_height: 3 pool: {method} }}"), [x])
    ref = ref_spp(x, 3, method)
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1, 2, 8), (1, 1, 8, 2)])
def test_spp_refuses_a_level_whose_pad_reaches_its_kernel_on_either_axis(shape):
    # 2 pixels over 4 bins: kernel 1, pad (4 - 2 + 1) // 2 = 1 = kernel; Caffe's pooling needs pad < kernel
    with pytest.raises(LayerError, match=r"pyramid level 2 \(4 bins\) needs pad \(\d, \d\) >= kernel"):
        run_forward(make_layer("SPP", "spp_param { pyramid_height: 3 }"), [np.ones(shape)])


@pytest.mark.parametrize("shape", [(1, 1, 0, 3), (1, 1, 3, 0)])
def test_spp_refuses_empty_inputs(shape):
    with pytest.raises(LayerError, match=r"Input dimensions cannot be zero"):
        run_forward(make_layer("SPP", "spp_param { pyramid_height: 1 }"), [np.ones(shape)])


def test_stochastic_spp_backward_routes_each_diff_to_the_sampled_value():
    """TRAIN backward: each level's top diff goes to the bottom element its forward pass sampled (and
    the levels' diffs add up)."""
    rng = np.random.default_rng(4)
    x = rng.uniform(0.1, 1, size=(2, 2, 4, 4))  # distinct values: a sampled value names its position
    context.set_random_seed(5)
    layer = make_layer("SPP", "spp_param { pyramid_height: 3 pool: STOCHASTIC }", phase=0)
    bottom, top = run_forward(layer, [x])
    dy = rng.normal(size=top[0].shape)
    top[0].diff[...] = dy
    layer.Backward(top, [True], bottom)
    want = np.zeros(x.shape).reshape(2, 2, 16)
    positions = np.broadcast_to(np.arange(16.0).reshape(1, 1, 4, 4), x.shape)
    k = 0
    for level in range(3):
        win, pos = _windows(x, level), _windows(positions, level)
        n = np.prod(win.shape[1:4])
        vals = top[0].data[:, k:k + n].reshape(win.shape[:4])
        hit = win == vals[..., None]
        assert (hit.sum(-1) == 1).all()
        p = np.take_along_axis(pos, hit.argmax(-1)[..., None], -1)[..., 0].astype(int)
        g = dy[:, k:k + n].reshape(win.shape[:4])
        for i in range(2):
            for c in range(2):
                np.add.at(want[i, c], p[i, c].ravel(), g[i, c].ravel())
        k += n
    np.testing.assert_allclose(bottom[0].diff, want.reshape(x.shape), rtol=1e-12)
