"""Loss-layer boundaries the mutation run showed untested: ContrastiveLoss's axis and label-shape checks,
out-of-range softmax axes named, label blobs shaped differently with the same first dimension and count."""
import numpy as np
import pytest

from caffe.layers import LayerError
from caffe.layers.testing import make_layer, run_forward


def test_contrastive_loss_bottom_and_label_shapes():
    a = np.zeros((2, 3, 1, 1, 1))
    with pytest.raises(LayerError, match=r"bottom\[0\] must have at most 4 axes"):
        run_forward(make_layer("ContrastiveLoss"), [a, a, np.zeros((2, 1, 1, 1))])
    a = np.zeros((2, 3, 1, 1))
    for label_shape in [(2, 1, 2, 1), (2, 1, 1, 2), (2, 2, 1, 1), (3, 1, 1, 1)]:
        with pytest.raises(LayerError):
            run_forward(make_layer("ContrastiveLoss"), [a, a, np.zeros(label_shape)])
    run_forward(make_layer("ContrastiveLoss"), [a, a, np.zeros((2, 1, 1, 1))])


@pytest.mark.parametrize("type_, field", [("SoftmaxWithLoss", "softmax_param"),
                                          ("InfogainLoss", "infogain_loss_param")])
def test_an_out_of_range_axis_is_named(type_, field):
    x, labels = np.zeros((2, 3)), np.zeros(2)
    extra = [np.eye(3)] if type_ == "InfogainLoss" else []
    with pytest.raises(LayerError, match=rf"\({type_}\): {field}\.axis = 2 is out of range"):
        run_forward(make_layer(type_, f"{field} {{ axis: 2 }}"), [x, labels] + extra)


@pytest.mark.parametrize("type_, field", [("SoftmaxWithLoss", "softmax_param"),
                                          ("InfogainLoss", "infogain_loss_param")])
def test_labels_need_only_the_first_dimension_and_the_count(type_, field):
    """Caffe checks bottom[1]'s first dimension and outer_num * inner_num == bottom[1].count(), nothing
    more: for (2, 3, 4) with axis 2 (4 classes), labels shaped (2, 3), (2, 1, 3) or (2, 3, 1) are the same."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4))
    labels = rng.integers(0, 4, size=(2, 3)).astype(np.float64)
    extra = [np.eye(4)] if type_ == "InfogainLoss" else []
    losses = [run_forward(make_layer(type_, f"{field} {{ axis: 2 }}"), [x, labels.reshape(shape)] + extra)[1][0]
              .data.item() for shape in [(2, 3), (2, 1, 3), (2, 3, 1)]]
    assert losses[0] == losses[1] == losses[2]
