"""LeNet's vision layers against BVLC Caffe's own outputs and gradients (shared/reference/lenet)."""
import pathlib

import numpy as np
import pytest

from caffe.blob import Blob
from caffe.layers.testing import make_layer

REF = pathlib.Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "lenet"

LAYERS = [  # name, type, prototxt, bottom, top (the deploy / train_input nets of the reference)
    ("conv1", "Convolution", "convolution_param { num_output: 20 kernel_size: 5 stride: 1 }", "data", "conv1"),
    ("pool1", "Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", "conv1", "pool1"),
    ("conv2", "Convolution", "convolution_param { num_output: 50 kernel_size: 5 stride: 1 }", "pool1", "conv2"),
    ("pool2", "Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", "conv2", "pool2"),
    ("ip1", "InnerProduct", "inner_product_param { num_output: 500 }", "pool2", "ip1"),
    ("relu1", "ReLU", "", "ip1", "ip1"),
    ("ip2", "InnerProduct", "inner_product_param { num_output: 10 }", "ip1", "ip2"),
]


def _need(path):
    if not path.exists():
        pytest.skip(f"{path} is absent: BVLC Caffe's LeNet reference outputs are not here")


def _net(iteration):
    """The layers with the reference weights, set up on the reference input batch."""
    _need(REF / f"params_iter{iteration}")
    blobs = {"data": Blob((64, 1, 28, 28))}
    blobs["data"].data[...] = np.load(REF / "input_data.npy")
    layers = []
    for name, type_name, text, bottom, top in LAYERS:
        layer = make_layer(type_name, text, name=name)
        if top not in blobs:
            blobs[top] = Blob()
        layer.SetUp([blobs[bottom]], [blobs[top]])
        for i, suffix in enumerate(("w", "b")[:len(layer.blobs)]):
            layer.blobs[i].data[...] = np.load(REF / f"params_iter{iteration}" / f"{name}_{suffix}.npy")
        layers.append((layer, blobs[bottom], blobs[top], name))
    return layers, blobs


@pytest.mark.parametrize("iteration", [0, 100])
def test_lenet_forward_matches_caffe(iteration):
    layers, blobs = _net(iteration)
    for layer, bottom, top, name in layers:
        layer.Forward([bottom], [top])
        if name == "ip1":
            np.testing.assert_allclose(top.data, np.load(REF / f"forward_iter{iteration}" / "ip1_prerelu.npy"),
                                       rtol=1e-5, atol=1e-5, err_msg=name)
        elif name in ("conv1", "pool1", "conv2", "pool2", "relu1", "ip2"):
            ref_name = "ip1" if name == "relu1" else name
            np.testing.assert_allclose(top.data, np.load(REF / f"forward_iter{iteration}" / f"{ref_name}.npy"),
                                       rtol=1e-5, atol=1e-5, err_msg=name)


def test_lenet_parameter_gradients_match_caffe():
    _need(REF / "backward_iter0")
    layers, blobs = _net(0)
    for layer, bottom, top, _ in layers:
        layer.Forward([bottom], [top])
    # SoftmaxWithLoss on ip2 (loss weight 1, normalized by the batch): d loss / d ip2 = (p - onehot) / N
    logits = blobs["ip2"].data.astype(np.float64)
    labels = np.load(REF / "input_label.npy").astype(int)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(64), labels]).mean()
    assert loss == pytest.approx(float(np.load(REF / "backward_iter0" / "loss.npy").reshape(-1)[0]), rel=1e-5)
    p[np.arange(64), labels] -= 1
    blobs["ip2"].diff[...] = p / 64
    for layer, bottom, top, _ in reversed(layers):
        for b in layer.blobs:
            b.diff[...] = 0
        layer.Backward([top], [bottom is not blobs["data"]], [bottom])
    for layer, _, _, name in layers:
        for i, suffix in enumerate(("w", "b")[:len(layer.blobs)]):
            ref = np.load(REF / "backward_iter0" / f"{name}_{suffix}_diff.npy")
            scale = np.abs(ref).max()
            np.testing.assert_allclose(layer.blobs[i].diff, ref, rtol=1e-5, atol=1e-6 * scale,
                                       err_msg=f"{name} {suffix}")
