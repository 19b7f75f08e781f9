"""Mutation survivors of the neuron layers (docs/MUTATION.md, layers-6): parameter values at which a
branch of the generic (GPU) path or the CPU path's dispatch changes, and boundaries of Caffe's formulas,
on both paths: the CPU path (compiled kernels) and the generic NumPy path (`_cpu.elementwise` None)."""
import math

import numpy as np
import pytest

from caffe.layers import LayerError, _cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

E = math.e
X = np.array([-2.0, -0.5, 0.0, 0.25, 0.75, 1.5])  # float32-exact, as the float parameters

# type, prototxt, x, expected top, expected bottom diff for a top diff of ones (Caffe's formulas)
CASES = [
    # negative_slope 1 is the identity; a slope at x == 0 is Caffe's (x > 0) + slope * (x <= 0)
    ("ReLU", "relu_param { negative_slope: 1 }", X, X, np.ones(6)),
    ("ReLU", "relu_param { negative_slope: 0.5 }", X, np.where(X > 0, X, 0.5 * X), np.where(X > 0, 1, 0.5)),
    ("ReLU", "", X, np.maximum(X, 0), (X > 0) * 1.0),
    # ELU's gradient at x == 0 is alpha + y = alpha (x <= 0 branch)
    ("ELU", "elu_param { alpha: 0.5 }", X, np.where(X > 0, X, 0.5 * np.expm1(X)),
     np.where(X > 0, 1, 0.5 * np.exp(X))),
    # Clip passes the gradient at both bounds (x >= min && x <= max), and min == max is allowed (Caffe
    # has no check; only min > max is refused)
    ("Clip", "clip_param { min: -0.5 max: 0.75 }", X, np.clip(X, -0.5, 0.75), ((X >= -0.5) & (X <= 0.75)) * 1.0),
    ("Clip", "clip_param { min: 0.25 max: 0.25 }", X, np.full(6, 0.25), (X == 0.25) * 1.0),
    # Exp: inner scale 2 (base e, scale 2); outer scale 2 (base 2, shift 1); shift 1 with base e
    ("Exp", "exp_param { scale: 2 }", X, np.exp(2 * X), 2 * np.exp(2 * X)),
    ("Exp", "exp_param { base: 2 shift: 1 }", X, 2.0 ** (1 + X), math.log(2) * 2.0 ** (1 + X)),
    ("Exp", "exp_param { shift: 1 }", X, np.exp(1 + X), np.exp(1 + X)),
    # Log: scale without shift, shift without scale
    ("Log", "log_param { scale: 2 }", X[3:], np.log(2 * X[3:]), 1 / X[3:]),
    ("Log", "log_param { shift: 1 }", X[1:], np.log(1 + X[1:]), 1 / (1 + X[1:])),
    # Power's special cases: power 1 (affine: scale without shift, shift without scale), scale 0 (the
    # constant shift ^ power, gradient 0 even where shift + scale * x is 0 and power - 1 < 0)
    ("Power", "power_param { power: 1 scale: 2 }", X, 2 * X, np.full(6, 2.0)),
    ("Power", "power_param { power: 1 shift: 1 }", X, X + 1, np.ones(6)),
    ("Power", "power_param { power: 1 scale: 0 shift: 2 }", X, np.full(6, 2.0), np.zeros(6)),
    ("Power", "power_param { power: 0.5 scale: 0 shift: 0 }", X, np.zeros(6), np.zeros(6)),
    ("Power", "power_param { power: 0 scale: 3 shift: 0 }", X, np.ones(6), np.zeros(6)),
]


def run(type_name, text, x, generic, monkeypatch, dtype=np.float64):
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)
    layer = make_layer(type_name, text)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    layer.Backward(top, [True], bottom)
    return top[0].data.copy(), bottom[0].diff.copy()


@pytest.mark.parametrize("generic", [False, True], ids=["cpu", "generic"])
@pytest.mark.parametrize("type_name, text, x, y, dx", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_neuron_parameter_boundaries(type_name, text, x, y, dx, generic, monkeypatch):
    got_y, got_dx = run(type_name, text, x, generic, monkeypatch)
    np.testing.assert_allclose(got_y, y, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got_dx, dx, rtol=1e-13, atol=1e-15)


NEURONS = [("ReLU", ""), ("ReLU", "relu_param { negative_slope: 0.2 }"), ("Sigmoid", ""), ("TanH", ""),
           ("ELU", ""), ("Swish", ""), ("BNLL", ""), ("AbsVal", ""), ("Clip", "clip_param { min: -1 max: 1 }"),
           ("Power", "power_param { power: 2 }"), ("Power", "power_param { power: 1 scale: 2 }"),
           ("Exp", ""), ("Log", "log_param { shift: 3 }"), ("Threshold", "")]


@pytest.mark.parametrize("generic", [False, True], ids=["cpu", "generic"])
@pytest.mark.parametrize("type_name, text", NEURONS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(NEURONS)])
def test_neuron_backward_leaves_the_bottom_diff_when_not_asked(type_name, text, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "elementwise", None)
    layer = make_layer(type_name, text)
    bottom, top = blobs_from_arrays([X]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    bottom[0].diff[...] = 7
    layer.Backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 7)


def test_neuron_parameter_errors_name_the_value():
    with pytest.raises(LayerError, match=r"Exp.*exp_param.base inf gives a non-finite log\(base\) = inf"):
        make_layer("Exp", "exp_param { base: inf }").SetUp(blobs_from_arrays([X]), empty_tops(1))
    with pytest.raises(LayerError, match=r"AbsVal.*does not allow in-place computation"):
        b = blobs_from_arrays([X])
        make_layer("AbsVal").SetUp(b, b)


@pytest.mark.parametrize("generic", [False, True], ids=["cpu", "generic"])
@pytest.mark.parametrize("shared", [False, True])
def test_prelu_gradient_at_zero_is_the_slope(generic, shared, monkeypatch):
    # Caffe: dx = dy * ((x > 0) + slope * (x <= 0)): an exact 0 takes the slope
    if generic:
        monkeypatch.setattr(_cpu, "channelwise", None)
    x = np.array([[[-1.0, 0.0, 2.0]], [[0.0, 3.0, -2.0]]])  # (2, 1, 3): one channel
    layer = make_layer("PReLU", f"prelu_param {{ channel_shared: {str(shared).lower()} "
                                "filler { type: 'constant' value: 0.25 } }")
    bottom, top = blobs_from_arrays([x]), empty_tops(1)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 2
    layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, np.where(x > 0, 2.0, 0.5))
    np.testing.assert_array_equal(layer.blobs[0].diff, [2 * (-1.0 - 2.0)])


@pytest.mark.parametrize("generic", [False, True], ids=["cpu", "generic"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("want_slope, want_bottom", [(True, False), (False, True)])
def test_prelu_backward_writes_only_what_was_asked(generic, dtype, want_slope, want_bottom, monkeypatch):
    if generic:
        monkeypatch.setattr(_cpu, "channelwise", None)
    x = np.random.default_rng(4).normal(size=(2, 3, 4))
    layer = make_layer("PReLU")
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, np.where(x > 0, x, 0.25 * x), rtol=1e-6)
    top[0].diff[...] = 1
    bottom[0].diff[...] = 7
    layer.blobs[0].diff[...] = 0
    layer.set_param_propagate_down(0, want_slope)
    layer.Backward(top, [want_bottom], bottom)
    assert np.all(bottom[0].diff == 7) != want_bottom
    assert np.all(layer.blobs[0].diff == 0) != want_slope
    if want_slope:
        np.testing.assert_allclose(layer.blobs[0].diff, (x * (x <= 0)).sum(axis=(0, 2)), rtol=1e-5)


def test_prelu_shape_errors():
    with pytest.raises(LayerError, match=r"PReLU.*at least 2 axes \(N, C, ...\), got shape \(3,\)"):
        make_layer("PReLU").SetUp(blobs_from_arrays([np.zeros(3)]), empty_tops(1))
    layer = make_layer("PReLU")
    bottom, top = blobs_from_arrays([np.zeros((2, 3))]), empty_tops(1)
    layer.SetUp(bottom, top)
    bottom[0].reshape((6,))
    with pytest.raises(LayerError, match=r"PReLU.*at least 2 axes \(N, C, ...\), got shape \(6,\)"):
        layer.Reshape(bottom, top)
    for shared, count, text in [(True, 3, "channel_shared needs 1"), (False, 1, "3 channels need 3")]:
        layer = make_layer("PReLU", f"prelu_param {{ channel_shared: {str(shared).lower()} }}")
        layer.blobs = blobs_from_arrays([np.zeros(count)])
        with pytest.raises(LayerError, match=rf"negative slope blob has {count} values but {text}"):
            layer.SetUp(blobs_from_arrays([np.zeros((2, 3))]), empty_tops(1))
