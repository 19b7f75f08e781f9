"""The Layer base: blob-count checks, loss weights, param_propagate_down, parameter handling."""
import numpy as np
import pytest

from caffe.blob import Blob
from caffe.layers import LayerError
from caffe.layers.layer import Layer, LossLayer
from caffe.layers.testing import blobs_from_arrays, empty_tops, layer_param, make_layer, run_forward


def setup(layer, n_bottom, n_top, shape=(2, 3)):
    bottom = blobs_from_arrays([np.ones(shape)] * n_bottom)
    top = empty_tops(n_top)
    layer.SetUp(bottom, top)
    return bottom, top


@pytest.mark.parametrize("type_name, nb, nt, pattern", [
    ("Sigmoid", 2, 1, r"Layer 'L' \(Sigmoid\): expects exactly 1 bottom blob\(s\), got 2"),
    ("Sigmoid", 1, 0, r"Layer 'L' \(Sigmoid\): expects exactly 1 top blob\(s\), got 0"),
    ("SoftmaxWithLoss", 1, 1, r"Layer 'L' \(SoftmaxWithLoss\): expects exactly 2 bottom blob\(s\), got 1"),
    ("InfogainLoss", 4, 1, r"Layer 'L' \(InfogainLoss\): expects at most 3 bottom blob\(s\), got 4"),
    ("InfogainLoss", 1, 1, r"Layer 'L' \(InfogainLoss\): expects at least 2 bottom blob\(s\), got 1"),
    ("Accuracy", 2, 0, r"Layer 'L' \(Accuracy\): expects at least 1 top blob\(s\), got 0"),
    ("Accuracy", 2, 3, r"Layer 'L' \(Accuracy\): expects at most 2 top blob\(s\), got 3"),
])
def test_blob_count_errors_name_layer_type_expected_and_actual(type_name, nb, nt, pattern):
    with pytest.raises(LayerError, match=pattern):
        setup(make_layer(type_name, name="L"), nb, nt)


def test_equal_num_bottom_top_blobs():
    class Pairwise(Layer):
        type = "Pairwise"
        equal_num_bottom_top_blobs = True

        def reshape(self, bottom, top):
            for b, t in zip(bottom, top):
                t.reshape_like(b)

    setup(Pairwise(layer_param("Pairwise", name="pw")), 2, 2)
    with pytest.raises(LayerError, match=r"'pw' \(Pairwise\): expects as many top blobs as bottom blobs, "
                                         r"got 2 bottom and 3 top"):
        setup(Pairwise(layer_param("Pairwise", name="pw")), 2, 3)


def test_loss_weight_presets_top_diff_and_forward_returns_the_weighted_sum():
    x = np.array([[-1.0, 0.0, 2.0]])
    layer = make_layer("Sigmoid", "loss_weight: 2.5")  # any layer may carry a loss weight
    bottom = blobs_from_arrays([x])
    top = empty_tops(1)
    layer.SetUp(bottom, top)
    np.testing.assert_array_equal(top[0].diff, 2.5)
    assert layer.loss(0) == 2.5
    loss = layer.Forward(bottom, top)
    y = 1 / (1 + np.exp(-x))
    assert loss == pytest.approx(2.5 * y.sum(), rel=1e-12)
    assert loss == pytest.approx(float(np.dot(top[0].data.ravel(), top[0].diff.ravel())), rel=1e-15)


def test_no_loss_weight_means_no_loss():
    layer = make_layer("Sigmoid")
    bottom, top = run_forward(layer, [np.ones(3)])
    assert layer.loss(0) == 0 and layer.Forward(bottom, top) == 0.0


def test_loss_layer_defaults_to_weight_one_and_zero_weight_is_no_loss():
    layer = make_layer("EuclideanLoss")
    bottom = blobs_from_arrays([np.ones((2, 2)), np.zeros((2, 2))])
    top = empty_tops(1)
    layer.SetUp(bottom, top)
    assert layer.loss(0) == 1.0 and float(top[0].diff) == 1.0
    assert layer.Forward(bottom, top) == pytest.approx(1.0)
    zero = make_layer("EuclideanLoss", "loss_weight: 0")
    zero.SetUp(bottom, top)
    assert zero.loss(0) == 0 and zero.Forward(bottom, top) == 0.0
    assert isinstance(layer, LossLayer)
    assert not make_layer("SoftmaxWithLoss").allow_force_backward(1)  # labels get no gradient


def test_loss_weight_count_must_match_tops():
    layer = make_layer("Sigmoid", "loss_weight: 1 loss_weight: 2", name="s")
    with pytest.raises(LayerError, match=r"'s' \(Sigmoid\): loss_weight must be unspecified or given once per top: "
                                         r"2 loss_weight\(s\) for 1 top\(s\)"):
        setup(layer, 1, 1)


def test_param_propagate_down():
    layer = make_layer("Sigmoid")
    assert layer.param_propagate_down(0) is False  # nothing set: no parameter gradients
    layer.set_param_propagate_down(2, False)
    assert [layer.param_propagate_down(i) for i in range(4)] == [True, True, False, False]
    # A layer with parameters turns its own on in setup; a net may turn it off (lr_mult 0).
    prelu = make_layer("PReLU")
    x = np.array([[[-1.0, 2.0]]])
    bottom, top = run_forward(prelu, [x])
    assert prelu.param_propagate_down(0)
    prelu.set_param_propagate_down(0, False)
    top[0].diff[...] = 1.0
    prelu.blobs[0].diff[...] = 0
    prelu.Backward(top, [True], bottom)
    np.testing.assert_array_equal(prelu.blobs[0].diff, 0)  # slope untouched
    np.testing.assert_array_equal(bottom[0].diff, [[[0.25, 1.0]]])


def test_layer_param_is_copied_and_blobs_round_trip_through_to_proto():
    param = layer_param("PReLU", "prelu_param { filler { type: 'constant' value: 0.5 } }", name="p")
    layer = make_layer("PReLU", "prelu_param { filler { type: 'constant' value: 0.5 } }", name="p")
    param.name = "changed"
    assert layer.name == "p"
    run_forward(layer, [np.ones((1, 3, 2))])
    proto = layer.to_proto()
    assert len(proto.blobs) == 1 and list(proto.blobs[0].shape.dim) == [3]
    from caffe.layers import create_layer
    again = create_layer(proto)  # parameters come back from the LayerParameter's blobs
    assert len(again.blobs) == 1
    np.testing.assert_array_equal(again.blobs[0].data, [0.5, 0.5, 0.5])


def test_blob_dtype_follows_bottom():
    layer = make_layer("PReLU")
    run_forward(layer, [np.ones((1, 2, 2))], dtype=np.float32)
    assert layer.blobs[0].dtype == np.float32
    layer = make_layer("PReLU")
    run_forward(layer, [np.ones((1, 2, 2))], dtype=np.float64)
    assert layer.blobs[0].dtype == np.float64
    assert isinstance(layer.blobs[0], Blob)
