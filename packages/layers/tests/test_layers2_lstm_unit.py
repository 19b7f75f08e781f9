"""LSTMUnit: gradient property (c_prev and gates; cont 0/1), Caffe's gate order and cont masking, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@given(n=st.integers(1, 3), d=st.integers(1, 3), seed=seeds(), data=st.data())
def test_lstm_unit_gradient_and_forward(n, d, seed, data):
    c_prev = random_array(seed, (1, n, d))
    x = random_array(seed + 1, (1, n, 4 * d), -2, 2)
    cont = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))).reshape(1, n)
    layer = make_layer("LSTMUnit")
    for b in (0, 1):
        bottom, top = check_layer_gradient(layer, [c_prev, x, cont], n_top=2, check_bottom=b)
    layer.Forward(bottom, top)
    i, f, o, g = (x[0, :, k * d:(k + 1) * d] for k in range(4))  # Caffe's gate order: i, f, o, g
    c = cont.T * sigmoid(f) * c_prev[0] + sigmoid(i) * np.tanh(g)
    np.testing.assert_allclose(top[0].data[0], c, rtol=1e-12)
    np.testing.assert_allclose(top[1].data[0], sigmoid(o) * np.tanh(c), rtol=1e-12)


def test_lstm_unit_cont_zero_masks_c_prev():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 2, 8))
    cont = np.array([[0.0, 1.0]])
    layer = make_layer("LSTMUnit")
    a, ta = run_forward(layer, [rng.normal(size=(1, 2, 2)), x, cont], n_top=2)
    b, tb = run_forward(make_layer("LSTMUnit"), [rng.normal(size=(1, 2, 2)), x, cont], n_top=2)
    np.testing.assert_array_equal(ta[0].data[0, 0], tb[0].data[0, 0])  # item 0 ignores its c_prev
    assert not np.allclose(ta[0].data[0, 1], tb[0].data[0, 1])
    for t in ta:
        t.diff[...] = 1
    layer.Backward(ta, [True, True, False], a)
    np.testing.assert_array_equal(a[0].diff[0, 0], 0)
    with pytest.raises(LayerError, match="Cannot backpropagate to sequence indicators"):
        layer.Backward(ta, [True, True, True], a)
    assert not layer.allow_force_backward(2) and layer.allow_force_backward(0)


def test_lstm_unit_shape_errors():
    with pytest.raises(LayerError, match=r"LSTMUnit.*4 \* D = 8.*x \(1, 2, 6\)"):
        run_forward(make_layer("LSTMUnit"), [np.zeros((1, 2, 2)), np.zeros((1, 2, 6)), np.zeros((1, 2))], n_top=2)
    with pytest.raises(LayerError, match=r"bottom\[2\] \(cont\).*cont \(1, 3\)"):
        run_forward(make_layer("LSTMUnit"), [np.zeros((1, 2, 2)), np.zeros((1, 2, 8)), np.zeros((1, 3))], n_top=2)
