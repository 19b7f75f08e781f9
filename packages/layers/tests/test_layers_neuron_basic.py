"""Neuron layers without parameter blobs: ReLU, Sigmoid, TanH, AbsVal, BNLL, ELU, Swish.

Each layer: forward against an independent NumPy formula, and a gradient property
over random shapes (and parameters) in the checker's element-wise mode.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import Blob
from caffe.layers import GradientCheckError, LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer, run_forward

SHAPES = shapes(min_dims=1, max_dims=4, max_side=3)


def _away(x, kink, radius):
    """Move values within `radius` of `kink` out of it (the checker also skips them)."""
    return np.where(np.abs(x - kink) < radius, kink + np.copysign(2 * radius, x - kink), x)


def forward(type_name, text, x):
    layer = make_layer(type_name, text)
    _, top = run_forward(layer, [x])
    return layer, top[0].data.copy()


# -- ReLU ---------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), slope=st.sampled_from([0.0, 0.01, 0.3, -0.5, 1.5]))
def test_relu_forward_and_gradient(shape, seed, slope):
    x = _away(random_array(seed, shape, -2, 2), 0.0, 0.01)
    text = f"relu_param {{ negative_slope: {slope} }}"
    _, y = forward("ReLU", text, x)
    np.testing.assert_allclose(y, np.where(x > 0, x, np.float32(slope) * x), rtol=1e-12)
    check_layer_gradient(make_layer("ReLU", text), [x], mode="eltwise", stepsize=1e-3, threshold=1e-5,
                         kink=0.0, kink_range=0.005)


def test_relu_in_place_backward():
    x = np.array([[-1.0, 2.0, -0.5, 3.0]])
    (b,) = [Blob(x.shape, dtype=np.float64)]
    b.data[...] = x
    layer = make_layer("ReLU")
    layer.SetUp([b], [b])
    layer.Forward([b], [b])
    np.testing.assert_array_equal(b.data, [[0, 2, 0, 3]])
    b.diff[...] = 1.0
    layer.Backward([b], [True], [b])
    np.testing.assert_array_equal(b.diff, [[0, 1, 0, 1]])


# -- Sigmoid / TanH -------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds())
def test_sigmoid_forward_and_gradient(shape, seed):
    x = random_array(seed, shape, -6, 6)
    _, y = forward("Sigmoid", "", x)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-12)
    check_layer_gradient(make_layer("Sigmoid"), [x], mode="eltwise", threshold=1e-5)


def test_sigmoid_saturates_without_overflow():
    with np.errstate(all="raise"):
        _, y = forward("Sigmoid", "", np.array([-1000.0, 0.0, 1000.0]))
    np.testing.assert_allclose(y, [0.0, 0.5, 1.0])


@given(shape=SHAPES, seed=seeds())
def test_tanh_forward_and_gradient(shape, seed):
    x = random_array(seed, shape, -3, 3)
    _, y = forward("TanH", "", x)
    np.testing.assert_allclose(y, (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1), rtol=1e-10, atol=1e-15)
    check_layer_gradient(make_layer("TanH"), [x], mode="eltwise", threshold=1e-5)


# -- AbsVal ---------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds())
def test_absval_forward_and_gradient(shape, seed):
    x = _away(random_array(seed, shape, -2, 2), 0.0, 0.01)
    _, y = forward("AbsVal", "", x)
    np.testing.assert_array_equal(y, np.abs(x))
    check_layer_gradient(make_layer("AbsVal"), [x], mode="eltwise", threshold=1e-5,
                         kink=0.0, kink_range=0.005)


@pytest.mark.parametrize("path", ["cpu", "xp"])
def test_absval_gradient_is_zero_at_zero(path):
    """Caffe's caffe_cpu_sign(0) is 0: nothing flows back through an exact 0 (either sign), on both paths."""
    x, dy = np.array([-1.5, 0.0, 2.0, -0.0]), np.array([1.0, 2.0, 3.0, 4.0])
    layer = make_layer("AbsVal")
    b, t = blobs_from_arrays([x]), empty_tops(1)
    layer.SetUp(b, t)
    layer.Forward(b, t)
    t[0].diff[...] = dy
    if path == "cpu":
        layer.backward_cpu(t, [True], b)
    else:
        layer.backward_xp(np, t, [True], b)
    np.testing.assert_array_equal(b[0].diff, [-1.0, 0.0, 3.0, 0.0])


def test_absval_rejects_in_place():
    b = Blob((2, 3), dtype=np.float64)
    layer = make_layer("AbsVal", name="abs1")
    with pytest.raises(LayerError, match=r"'abs1' \(AbsVal\).*in-place"):
        layer.SetUp([b], [b])


# -- BNLL -------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds())
def test_bnll_forward_and_gradient(shape, seed):
    x = random_array(seed, shape, -4, 4)
    _, y = forward("BNLL", "", x)
    np.testing.assert_allclose(y, np.log(1 + np.exp(x)), rtol=1e-12)
    check_layer_gradient(make_layer("BNLL"), [x], mode="eltwise", threshold=1e-5)


def test_bnll_large_inputs_follow_caffe_threshold():
    x = np.array([-800.0, -60.0, 60.0, 800.0])
    with np.errstate(over="raise"):
        layer, y = forward("BNLL", "", x)
    np.testing.assert_allclose(y, [0.0, np.log1p(np.exp(-60.0)), 60.0, 800.0], rtol=1e-15, atol=0)
    b = [Blob(x.shape, dtype=np.float64)]
    b[0].data[...] = x
    t = [Blob(dtype=np.float64)]
    layer.SetUp(b, t)
    layer.Forward(b, t)
    t[0].diff[...] = 1.0
    layer.Backward(t, [True], b)
    # Caffe clamps exp at kBNLL_THRESHOLD = 50: the slope for huge x is e^50 / (e^50 + 1).
    e50 = np.exp(50.0)
    np.testing.assert_allclose(b[0].diff, [np.exp(-800.0) / (1 + np.exp(-800.0)), np.exp(-60) / (1 + np.exp(-60)),
                                           e50 / (e50 + 1), e50 / (e50 + 1)], rtol=1e-14)


# -- ELU -------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), alpha=st.sampled_from([1.0, 0.5, 2.0, 0.1]))
def test_elu_forward_and_gradient(shape, seed, alpha):
    x = _away(random_array(seed, shape, -3, 3), 0.0, 0.01)
    text = f"elu_param {{ alpha: {alpha} }}"
    _, y = forward("ELU", text, x)
    a = float(np.float32(alpha))  # the parameter is a float32 field
    np.testing.assert_allclose(y, np.where(x > 0, x, a * (np.exp(x) - 1)), rtol=1e-12)
    check_layer_gradient(make_layer("ELU", text), [x], mode="eltwise", threshold=1e-5,
                         kink=0.0, kink_range=0.005)


def test_elu_default_alpha_is_one():
    _, y = forward("ELU", "", np.array([-1.0, 2.0]))
    np.testing.assert_allclose(y, [np.exp(-1) - 1, 2.0])


def test_elu_in_place_matches_out_of_place():
    x = np.array([-2.0, -0.5, 0.25, 3.0])
    ref_layer, _ = forward("ELU", "elu_param { alpha: 0.7 }", x)
    b = Blob(x.shape, dtype=np.float64)
    b.data[...] = x
    layer = make_layer("ELU", "elu_param { alpha: 0.7 }")
    layer.SetUp([b], [b])
    layer.Forward([b], [b])
    b.diff[...] = 1.0
    layer.Backward([b], [True], [b])
    np.testing.assert_allclose(b.diff, np.where(x > 0, 1.0, np.float32(0.7) * np.exp(x)), rtol=1e-6)


# -- Swish -------------------------------------------------------------------------------

@given(shape=SHAPES, seed=seeds(), beta=st.sampled_from([1.0, 0.5, 2.0, 10.0]))
def test_swish_forward_and_gradient(shape, seed, beta):
    x = random_array(seed, shape, -3, 3)
    text = f"swish_param {{ beta: {beta} }}"
    _, y = forward("Swish", text, x)
    b = float(np.float32(beta))
    # Caffe's 0.5 * tanh(0.5 x) + 0.5 loses relative precision deep in the negative tail.
    np.testing.assert_allclose(y, x / (1 + np.exp(-b * x)), rtol=1e-10, atol=1e-14)
    check_layer_gradient(make_layer("Swish", text), [x], mode="eltwise", stepsize=1e-4, threshold=1e-5)


# -- the checker really catches these layers' mistakes --------------------------------

def test_gradient_check_catches_a_slightly_wrong_elu_backward():
    base = type(make_layer("ELU"))

    class Wrong(base):
        def Backward(self, top, propagate_down, bottom):
            super().Backward(top, propagate_down, bottom)
            bottom[0].diff[...] *= 1.001  # 0.1 % off

    layer = Wrong(make_layer("ELU", "elu_param { alpha: 0.5 }").layer_param)
    with pytest.raises(GradientCheckError):
        check_layer_gradient(layer, [np.array([-1.0, -0.3, 0.4])], mode="eltwise", threshold=1e-5)
