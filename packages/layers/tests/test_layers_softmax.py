"""Softmax: forward against NumPy over any axis, stability, gradient, bad axis."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward


def _softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=4), seed=seeds(), data=st.data())
def test_softmax_forward_any_axis(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = random_array(seed, shape, -5, 5)
    _, top = run_forward(make_layer("Softmax", f"softmax_param {{ axis: {axis} }}"), [x])
    y = top[0].data
    assert y.shape == x.shape
    np.testing.assert_allclose(y, _softmax_ref(x, axis), rtol=1e-12)
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-12)


@given(shape=shapes(min_dims=1, max_dims=3, max_side=3), seed=seeds(), data=st.data())
def test_softmax_gradient(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = random_array(seed, shape, -2, 2)
    check_layer_gradient(make_layer("Softmax", f"softmax_param {{ axis: {axis} }}"), [x],
                         mode="exhaustive", stepsize=1e-4, threshold=1e-6)


def test_softmax_default_axis_is_one_and_large_inputs_are_stable():
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1e4, -1000.0]])[:, :, None]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        _, top = run_forward(make_layer("Softmax"), [x])
    e = np.exp(-1.0)
    np.testing.assert_allclose(top[0].data[:, :, 0], [[1 / (2 + e), 1 / (2 + e), e / (2 + e)], [0.5, 0.0, 0.5]])


def test_softmax_float32():
    x = np.random.default_rng(0).uniform(-3, 3, (2, 5, 3))
    _, top = run_forward(make_layer("Softmax"), [x], dtype=np.float32)
    assert top[0].data.dtype == np.float32
    np.testing.assert_allclose(top[0].data, _softmax_ref(x, 1), rtol=1e-5)


@pytest.mark.parametrize("axis", [3, -4])
def test_softmax_axis_out_of_range(axis):
    with pytest.raises(LayerError, match=rf"'sm' \(Softmax\): softmax_param.axis = {axis} is out of range"):
        run_forward(make_layer("Softmax", f"softmax_param {{ axis: {axis} }}", name="sm"), [np.ones((2, 3, 4))])
