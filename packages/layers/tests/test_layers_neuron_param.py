"""Neuron layers with parameters: PReLU, Power, Exp, Log, Threshold, Clip, Dropout."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import GradientCheckError, LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer, run_forward
from caffe.proto import caffe_pb2

SHAPES = shapes(min_dims=1, max_dims=4, max_side=3)
f32 = lambda v: float(np.float32(v))  # parameter fields are float32  # noqa: E731


def _away(x, kink, radius):
    return np.where(np.abs(x - kink) < radius, kink + np.copysign(2 * radius, x - kink), x)


def forward(type_name, text, x, **kw):
    layer = make_layer(type_name, text, **kw)
    _, top = run_forward(layer, [x])
    return layer, top[0].data.copy()


def forward_backward(layer, x, dy, in_place=False):
    b = blobs_from_arrays([x])
    t = b if in_place else empty_tops(1)
    layer.SetUp(b, t)
    layer.Forward(b, t)
    y = t[0].data.copy()
    t[0].diff[...] = dy
    layer.Backward(t, [True], b)
    return y, b[0].diff.copy()


# -- PReLU ------------------------------------------------------------------------------

@given(shape=shapes(min_dims=2, max_dims=3, max_side=3), seed=seeds(), shared=st.booleans())
def test_prelu_forward_and_gradient(shape, seed, shared):
    x = _away(random_array(seed, shape, -2, 2), 0.0, 0.01)
    text = (f"prelu_param {{ channel_shared: {str(shared).lower()} "
            f"filler {{ type: 'uniform' min: -0.8 max: 0.9 }} }}")
    context.set_random_seed(seed)
    layer, y = forward("PReLU", text, x)
    a = layer.blobs[0].data.copy()
    assert a.shape == (() if shared else (shape[1],))
    a_b = a if shared else a.reshape((1, -1) + (1,) * (len(shape) - 2))
    np.testing.assert_allclose(y, np.where(x > 0, x, a_b * x), rtol=1e-12)
    context.set_random_seed(seed)
    check_layer_gradient(make_layer("PReLU", text), [x], mode="exhaustive", stepsize=1e-3, threshold=1e-5,
                         kink=0.0, kink_range=0.005)


def test_prelu_default_slope_is_a_quarter_per_channel():
    layer, y = forward("PReLU", "", np.array([[[-4.0], [4.0]], [[-8.0], [-1.0]]]))
    np.testing.assert_array_equal(layer.blobs[0].data, [0.25, 0.25])
    np.testing.assert_array_equal(y, [[[-1.0], [4.0]], [[-2.0], [-0.25]]])
    assert layer.param_propagate_down(0)


def test_prelu_slope_gradient_sums_over_batch_and_space_and_accumulates():
    x = np.array([[[-1.0, 2.0], [-3.0, -4.0]], [[-5.0, 6.0], [7.0, -0.5]]])  # (N=2, C=2, 2)
    dy = np.arange(1.0, 9.0).reshape(x.shape)
    layer = make_layer("PReLU")
    _, dx = forward_backward(layer, x, dy)
    expect = [(-1.0 * 1) + (-5.0 * 5), (-3.0 * 3) + (-4.0 * 4) + (-0.5 * 8)]
    np.testing.assert_allclose(layer.blobs[0].diff, expect)
    np.testing.assert_allclose(dx, dy * np.where(x > 0, 1.0, 0.25))
    b = blobs_from_arrays([x])
    t = empty_tops(1)
    layer.Forward(b, t)
    t[0].diff[...] = dy
    layer.Backward(t, [True], b)  # Caffe accumulates parameter gradients until ClearParamDiffs
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * np.array(expect))


def test_prelu_in_place_equals_out_of_place():
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 4))
    dy = np.random.default_rng(4).uniform(-1, 1, x.shape)
    y1, dx1 = forward_backward(make_layer("PReLU"), x, dy)
    l2 = make_layer("PReLU")
    y2, dx2 = forward_backward(l2, x, dy, in_place=True)
    np.testing.assert_allclose(y1, y2)
    np.testing.assert_allclose(dx1, dx2)


def test_prelu_bad_inputs():
    with pytest.raises(LayerError, match=r"'p' \(PReLU\).*at least 2 axes"):
        run_forward(make_layer("PReLU", name="p"), [np.ones(3)])
    param = make_layer("PReLU").layer_param
    param.blobs.add().CopyFrom(caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[2]), data=[0.1, 0.2]))
    from caffe.layers import create_layer
    with pytest.raises(LayerError, match="2 values but 3 channels need 3"):
        run_forward(create_layer(param), [np.ones((1, 3, 2))])


# -- Power ------------------------------------------------------------------------------

def _power_ref(x, power, scale, shift):
    if power * scale == 0:
        return np.full_like(x, 1.0 if power == 0 else shift ** power)
    return (shift + scale * x) ** power


@given(shape=SHAPES, seed=seeds(), power=st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, -1.0, 1.5, -0.37]),
       scale=st.sampled_from([1.0, 0.0, -0.8, 0.6, 2.0]), shift=st.sampled_from([0.0, 0.7, -1.25]))
def test_power_forward_and_gradient(shape, seed, power, scale, shift):
    x = random_array(seed, shape, -1, 1)
    if power != int(power) or power < 0:
        shift = 2.5  # keep shift + scale * x positive (>= 0.5) for fractional and negative powers
    text = f"power_param {{ power: {power} scale: {scale} shift: {shift} }}"
    _, y = forward("Power", text, x)
    np.testing.assert_allclose(y, _power_ref(x, f32(power), f32(scale), f32(shift)), rtol=1e-12)
    check_layer_gradient(make_layer("Power", text), [x], mode="eltwise", stepsize=1e-4, threshold=1e-5)


def test_power_special_cases_match_caffe():
    x = np.array([0.0, 1.0, -2.0])
    # diff_scale = power * scale == 0: constant output and zero gradient.
    y, dx = forward_backward(make_layer("Power", "power_param { power: 0 scale: 3 shift: 2 }"), x, np.ones(3))
    np.testing.assert_array_equal(y, [1, 1, 1])
    np.testing.assert_array_equal(dx, [0, 0, 0])
    y, dx = forward_backward(make_layer("Power", "power_param { power: 3 scale: 0 shift: 2 }"), x, np.ones(3))
    np.testing.assert_array_equal(y, [8, 8, 8])
    np.testing.assert_array_equal(dx, [0, 0, 0])
    # power == 1: gradient is the constant scale.
    y, dx = forward_backward(make_layer("Power", "power_param { power: 1 scale: -3 shift: 1 }"), x,
                             np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(y, [1, -2, 7])
    np.testing.assert_array_equal(dx, [-3, -6, -9])
    # power 2 at a zero base: 2 * scale * (shift + scale x) = 0, no 0/0.
    y, dx = forward_backward(make_layer("Power", "power_param { power: 2 scale: 2 shift: 0 }"), x, np.ones(3))
    np.testing.assert_array_equal(dx, [0, 8, -16])


# -- Exp ----------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), base=st.sampled_from([-1.0, 2.0, 0.5, 10.0]),
       scale=st.sampled_from([1.0, 0.5, -1.25]), shift=st.sampled_from([0.0, 0.375, -1.0]))
def test_exp_forward_and_gradient(shape, seed, base, scale, shift):
    x = random_array(seed, shape, -1, 1)
    text = f"exp_param {{ base: {base} scale: {scale} shift: {shift} }}"
    _, y = forward("Exp", text, x)
    b = np.e if base == -1 else base
    np.testing.assert_allclose(y, b ** (shift + scale * x), rtol=1e-12)
    check_layer_gradient(make_layer("Exp", text), [x], mode="eltwise", stepsize=1e-4, threshold=1e-5)


@pytest.mark.parametrize("base", [0.0, -2.0, -0.5])
def test_exp_rejects_non_positive_base(base):
    with pytest.raises(LayerError, match=r"'e' \(Exp\): exp_param.base must be strictly positive"):
        run_forward(make_layer("Exp", f"exp_param {{ base: {base} }}", name="e"), [np.ones(2)])


# -- Log ----------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), base=st.sampled_from([-1.0, 2.0, 10.0, 0.5]),
       scale=st.sampled_from([1.0, 0.5, 2.0, -0.5]), shift=st.sampled_from([0.0, 0.25]))
def test_log_forward_and_gradient(shape, seed, base, scale, shift):
    x = random_array(seed, shape, 0.5, 2.0)
    if scale < 0:
        shift = 2.0  # keep shift + scale * x >= 1
    text = f"log_param {{ base: {base} scale: {scale} shift: {shift} }}"
    _, y = forward("Log", text, x)
    ln_b = 1.0 if base == -1 else np.log(base)
    np.testing.assert_allclose(y, np.log(shift + scale * x) / ln_b, rtol=1e-12, atol=1e-15)
    check_layer_gradient(make_layer("Log", text), [x], mode="eltwise", stepsize=1e-4, threshold=1e-5)


@pytest.mark.parametrize("base", [0.0, -3.0, 1.0])
def test_log_rejects_invalid_base(base):
    with pytest.raises(LayerError, match=r"'lg' \(Log\): log_param.base"):
        run_forward(make_layer("Log", f"log_param {{ base: {base} }}", name="lg"), [np.ones(2)])


# -- Threshold ------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), t=st.sampled_from([0.0, 0.5, -1.0]))
def test_threshold_forward(shape, seed, t):
    x = random_array(seed, shape, -2, 2)
    x.flat[0] = t  # equal to the threshold: not strictly greater, so 0
    _, y = forward("Threshold", f"threshold_param {{ threshold: {t} }}", x)
    np.testing.assert_array_equal(y, (x > t).astype(float))
    assert y.flat[0] == 0
    layer = make_layer("Threshold", f"threshold_param {{ threshold: {t} }}")  # the generic (GPU) path too
    b, top = blobs_from_arrays([x]), empty_tops(1)
    layer.SetUp(b, top)
    layer.forward_xp(np, b, top)
    np.testing.assert_array_equal(top[0].data, y)


def test_threshold_has_no_backward():
    layer = make_layer("Threshold", name="th")
    b = blobs_from_arrays([np.array([0.5, -0.5])])
    t = empty_tops(1)
    layer.SetUp(b, t)
    layer.Forward(b, t)
    layer.Backward(t, [False], b)  # nothing requested: fine
    with pytest.raises(LayerError, match=r"'th' \(Threshold\): backward is not implemented"):
        layer.Backward(t, [True], b)


# -- Clip ---------------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), bounds=st.sampled_from([(-0.5, 1.0), (0.25, 0.75), (-2.5, -1.0), (0.0, 0.0)]))
def test_clip_forward_and_gradient(shape, seed, bounds):
    lo, hi = bounds
    x = _away(_away(random_array(seed, shape, -2, 2), lo, 0.01), hi, 0.01)
    text = f"clip_param {{ min: {lo} max: {hi} }}"
    _, y = forward("Clip", text, x)
    np.testing.assert_array_equal(y, np.minimum(np.maximum(x, lo), hi))
    check_layer_gradient(make_layer("Clip", text), [x], mode="eltwise", threshold=1e-5)


def test_clip_gradient_passes_at_the_bounds_inclusive():
    x = np.array([-1.0, -0.5, 0.0, 1.0, 1.5])
    _, dx = forward_backward(make_layer("Clip", "clip_param { min: -0.5 max: 1.0 }"), x, np.full(5, 2.0))
    np.testing.assert_array_equal(dx, [0, 2, 2, 2, 0])


def test_clip_bad_parameters():
    with pytest.raises(LayerError, match=r"'c' \(Clip\): clip_param.max is required"):
        run_forward(make_layer("Clip", "clip_param { min: 0 }", name="c"), [np.ones(2)])
    with pytest.raises(LayerError, match="clip_param.min .* must not exceed"):
        run_forward(make_layer("Clip", "clip_param { min: 2 max: 1 }"), [np.ones(2)])


# -- Dropout ---------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), ratio=st.sampled_from([0.5, 0.1, 0.8, 0.0]))
def test_dropout_train_gradient_uses_the_forward_mask(shape, seed, ratio):
    x = random_array(seed, shape, 0.1, 2)
    check_layer_gradient(make_layer("Dropout", f"dropout_param {{ dropout_ratio: {ratio} }}"), [x],
                         mode="eltwise", threshold=1e-6, seed=seed)


def test_dropout_train_forward_backward_statistics_and_reproducibility():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (20, 50, 10))
    dy = np.random.default_rng(1).uniform(-1, 1, x.shape)
    for ratio in (0.3, 0.75):
        text = f"dropout_param {{ dropout_ratio: {ratio} }}"
        context.set_random_seed(42)
        y, dx = forward_backward(make_layer("Dropout", text), x, dy)
        kept = y != 0
        scale = 1 / (1 - f32(ratio))
        np.testing.assert_allclose(y[kept], x[kept] * scale, rtol=1e-12)
        np.testing.assert_allclose(dx, dy * kept * scale, rtol=1e-12)  # backward reuses the mask
        assert abs(1 - kept.mean() - ratio) < 0.01  # 10,000 draws: std of the dropped fraction < 0.005
        context.set_random_seed(42)
        y2, _ = forward_backward(make_layer("Dropout", text), x, dy)
        np.testing.assert_array_equal(y, y2)
        context.set_random_seed(43)
        y3, _ = forward_backward(make_layer("Dropout", text), x, dy)
        assert not np.array_equal(y, y3)


def test_dropout_test_phase_is_identity():
    x = np.random.default_rng(0).uniform(-1, 1, (3, 4))
    dy = np.random.default_rng(1).uniform(-1, 1, x.shape)
    y, dx = forward_backward(make_layer("Dropout", "dropout_param { dropout_ratio: 0.6 }", phase=caffe_pb2.TEST),
                             x, dy)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)


def test_dropout_without_scale_train():
    """scale_train: false (a fork's field; our schema follows BVLC): bare mask in TRAIN, (1 - ratio) in TEST."""
    from caffe.layers.dropout import DropoutLayer

    class Unscaled(DropoutLayer):
        def read_scale_train(self):
            return False

    x = np.random.default_rng(0).uniform(0.5, 1.5, (40, 25))
    dy = np.ones_like(x)
    train = Unscaled(make_layer("Dropout", "dropout_param { dropout_ratio: 0.25 }").layer_param)
    y, dx = forward_backward(train, x, dy)
    kept = y != 0
    np.testing.assert_array_equal(y[kept], x[kept])
    np.testing.assert_array_equal(dx, kept.astype(float))
    test = Unscaled(make_layer("Dropout", "dropout_param { dropout_ratio: 0.25 }", phase=caffe_pb2.TEST).layer_param)
    y, dx = forward_backward(test, x, dy)
    np.testing.assert_allclose(y, x * 0.75)
    np.testing.assert_allclose(dx, dy * 0.75)


@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5])
def test_dropout_rejects_bad_ratio(ratio):
    with pytest.raises(LayerError, match=r"'d' \(Dropout\): dropout_param.dropout_ratio must be in \[0, 1\)"):
        run_forward(make_layer("Dropout", f"dropout_param {{ dropout_ratio: {ratio} }}", name="d"), [np.ones(2)])


def test_dropout_gradient_check_fails_if_the_mask_were_redrawn():
    """Backward must use the forward's mask: a layer that redraws it fails the check."""
    from caffe.layers.dropout import DropoutLayer

    class Redraws(DropoutLayer):
        def Backward(self, top, propagate_down, bottom):
            self._draw_mask(bottom[0])  # a fresh rand_vec_
            super().Backward(top, propagate_down, bottom)

    x = np.random.default_rng(0).uniform(0.5, 1.5, (4, 5))
    with pytest.raises(GradientCheckError):
        check_layer_gradient(Redraws(make_layer("Dropout").layer_param), [x], mode="eltwise", threshold=1e-6)


# -- in-place use (top is the bottom blob), as nets write `top: same as bottom` ----------------

@pytest.mark.parametrize("type_name, text, low", [
    ("ReLU", "relu_param { negative_slope: 0.2 }", -2), ("Sigmoid", "", -2), ("TanH", "", -2), ("BNLL", "", -2),
    ("ELU", "", -2), ("Swish", "swish_param { beta: 0.7 }", -2), ("PReLU", "", -2),
    ("Power", "power_param { power: 1.5 scale: 0.5 shift: 2 }", -2), ("Exp", "exp_param { scale: 0.5 }", -2),
    ("Log", "log_param { base: 2 shift: 0.5 }", 0.1), ("Clip", "clip_param { min: -0.5 max: 0.5 }", -2),
    ("Dropout", "", -2),
])
def test_in_place_equals_out_of_place(type_name, text, low):
    x = np.random.default_rng(0).uniform(low, 2, (2, 3, 4))
    dy = np.random.default_rng(1).uniform(-1, 1, x.shape)
    context.set_random_seed(9)
    y1, dx1 = forward_backward(make_layer(type_name, text), x, dy)
    context.set_random_seed(9)
    y2, dx2 = forward_backward(make_layer(type_name, text), x, dy, in_place=True)
    np.testing.assert_allclose(y2, y1, rtol=1e-14)
    np.testing.assert_allclose(dx2, dx1, rtol=1e-14)
