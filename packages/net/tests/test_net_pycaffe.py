"""pycaffe's Net surface: constructors, dict views, forward/backward by name, batching, MemoryData inputs,
the Classifier, and a pycaffe-style script run unchanged."""
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import caffe
from caffe.layers import layer_type_list
from caffe.net.testing import input_layer, python_layer
from caffe.proto import caffe_pb2

NET = "\n".join([
    'name: "py"',
    'layer { name: "input" type: "Input" top: "data" top: "label" '
    'input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } include { phase: TRAIN } }',
    'layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } '
    'include { phase: TEST } }',
    python_layer("scale1", "ChannelScale", ["data"], ["s1"], param_str="2"),
    'layer { name: "relu" type: "ReLU" bottom: "s1" top: "s1" }',
    python_layer("scale2", "ChannelScale", ["s1"], ["s2"], param_str="3"),
    python_layer("loss", "SumSquaresLoss", ["s2"], ["loss"], extra="loss_weight: 1 include { phase: TRAIN }"),
])


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return str(path)


def test_top_level_names():
    assert caffe.Net is caffe.net.Net and caffe.Classifier is caffe.net.Classifier
    assert caffe.io is caffe.net.io and caffe.TRAIN == caffe_pb2.TRAIN and caffe.TEST == caffe_pb2.TEST


def test_constructors(model, tmp_path):
    train = caffe.Net(model, caffe.TRAIN)
    assert train.inputs == ["data", "label"] and train.outputs == ["label", "loss"]  # nobody reads label
    test = caffe.Net(model, caffe.TEST)
    assert test.inputs == ["data"] and test.outputs == ["s2"] and test.phase == caffe.TEST
    weights = str(tmp_path / "w.caffemodel")
    train.params["scale1"][0].data[...] = 5
    train.save(weights)
    for net in (caffe.Net(model, weights, caffe.TEST), caffe.Net(model, caffe.TEST, weights=weights),
                caffe.Net(Path(model), phase=caffe.TEST, weights=weights)):
        np.testing.assert_array_equal(net.params["scale1"][0].data, 5)
    param = caffe_pb2.NetParameter()
    from google.protobuf import text_format
    text_format.Parse(NET, param)
    assert caffe.Net(param, caffe.TEST).layer_names == test.layer_names
    assert caffe.Net(NET, caffe.TRAIN).layer_names == train.layer_names  # prototxt text
    staged = caffe.Net(model, caffe.TEST, level=2, stages=["deploy"])
    assert staged.layer_names == test.layer_names


def test_dict_views(model):
    net = caffe.Net(model, caffe.TRAIN)
    assert isinstance(net.blobs, OrderedDict) and list(net.blobs) == ["data", "label", "s1", "s2", "loss"]
    assert list(net.params) == ["scale1", "scale2"] and net.params["scale1"][0].shape == (3,)
    assert list(net.layer_dict) == net._layer_names == ["input", "scale1", "relu", "scale2", "loss"]
    assert net.layer_dict["relu"].type == "ReLU" and len(net.layers) == 5
    assert net.blob_loss_weights == OrderedDict([("data", 0), ("label", 0), ("s1", 0), ("s2", 0), ("loss", 1)])
    assert net.top_names["relu"] == ["s1"] and net.bottom_names["scale2"] == ["s1"]
    assert net._blob_names == list(net.blobs) and net._top_ids(1) == [2] and net._bottom_ids(1) == [0]
    net.blobs["data"].data[...] = [[1, -1, 2], [0, 3, -4]]  # writable views feed the net
    net.forward()
    np.testing.assert_array_equal(net.blobs["s2"].data, 6 * np.maximum([[1, -1, 2], [0, 3, -4]], 0))


def test_forward_backward_by_name(model):
    net = caffe.Net(model, caffe.TRAIN)
    x = np.array([[1, -1, 2], [0, 3, -4]], np.float32)
    out = net.forward(data=x, label=np.zeros(2))
    assert set(out) == {"label", "loss"} and out["loss"] == pytest.approx(0.5 * ((6 * np.maximum(x, 0)) ** 2).sum())
    part = net.forward(blobs=["s1"], end="relu")
    assert set(part) == {"s1"}
    net.blobs["s2"].data[...] = 0
    later = net.forward(start="scale2", end="scale2")
    np.testing.assert_array_equal(later["s2"], 6 * np.maximum(x, 0))
    net.forward(data=x, label=np.zeros(2))
    grads = net.backward(diffs=["s1"])
    assert set(grads) == {"data", "label", "s1"}
    test = caffe.Net(model, caffe.TEST)
    test.params["scale2"][0].data[...] = 3
    test.forward(data=x)
    d = test.backward(s2=np.ones((2, 3), np.float32))
    assert set(d) == {"data"}  # no loss in TEST: nothing needs backward, so no gradient reaches data
    with pytest.raises(ValueError, match="Top diff arguments do not match net outputs"):
        test.backward(nope=np.ones((2, 3)))


def test_forward_all_pads_and_trims(model):
    net = caffe.Net(model, caffe.TEST)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    out = net.forward_all(data=x)
    np.testing.assert_allclose(out["s2"], 6 * np.maximum(x, 0), rtol=1e-6)
    extra = net.forward_all(blobs=["s1"], data=x)
    assert set(extra) == {"s1", "s2"} and extra["s1"].shape == (5, 3)


def test_forward_backward_all(tmp_path):
    text = NET + "\nforce_backward: true"
    path = tmp_path / "fb.prototxt"
    path.write_text(text)
    net = caffe.Net(str(path), caffe.TEST)
    x = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    outs, diffs = net.forward_backward_all(data=x, s2=np.ones((3, 3), np.float32))
    np.testing.assert_allclose(outs["s2"], 6 * np.maximum(x, 0), rtol=1e-6)
    np.testing.assert_allclose(diffs["data"], 6 * (x > 0), rtol=1e-6)


def test_set_input_arrays_needs_memory_data(model):
    net = caffe.Net(model, caffe.TEST)
    with pytest.raises(TypeError, match="first layer is a MemoryData layer \\(the first layer 'input' is a "
                                        "Input layer\\)"):
        net.set_input_arrays(np.zeros((2, 3, 1, 1), np.float32), np.zeros(2, np.float32))


def test_set_input_arrays_with_memory_data():
    if "MemoryData" not in layer_type_list():
        pytest.skip("layer type MemoryData is not implemented yet (caffe-layers)")
    net = caffe.Net('layer { name: "m" type: "MemoryData" top: "data" top: "label" memory_data_param '
                    '{ batch_size: 2 channels: 1 height: 2 width: 2 } } '
                    'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }', caffe.TEST)
    data = np.arange(16, dtype=np.float32).reshape(4, 1, 2, 2) - 8
    labels = np.arange(4, dtype=np.float32)
    net.set_input_arrays(data, labels)
    out = net.forward(blobs=["label"])
    np.testing.assert_array_equal(out["r"], np.maximum(data[:2], 0))
    np.testing.assert_array_equal(out["label"].ravel(), [0, 1])
    np.testing.assert_array_equal(net.forward(blobs=["label"])["label"].ravel(), [2, 3])
    with pytest.raises(ValueError, match="multiple of the batch size"):
        net.set_input_arrays(data[:3], labels[:3])
    with pytest.raises(ValueError, match="float32"):
        net.set_input_arrays(data.astype(np.float64), labels)
    with pytest.raises(ValueError, match="shape \\(N, 1, 2, 2\\)"):
        net.set_input_arrays(np.zeros((2, 1, 3, 2), np.float32), labels[:2])


def test_pycaffe_script_with_python_layers(model, tmp_path):
    # a typical pycaffe session, written as users write it
    net = caffe.Net(model, caffe.TRAIN)
    net.blobs['data'].data[...] = np.array([[1, 2, 3], [-1, 0.5, 2]])
    net.blobs['label'].data[...] = [0, 1]
    loss = net.forward()['loss']
    s2 = net.blobs['s2'].data.copy()
    for name in net.params:
        for p in net.params[name]:
            p.diff[...] = 0
    net.backward()
    grad = net.params['scale1'][0].diff.copy()
    assert loss > 0 and np.abs(grad).sum() > 0
    net.params['scale1'][0].data[...] -= 0.01 * grad
    snapshot = str(tmp_path / 'snap.caffemodel')
    net.save(snapshot)
    net2 = caffe.Net(model, snapshot, caffe.TEST)
    out = net2.forward(data=np.array([[1, 2, 3], [-1, 0.5, 2]], np.float32))
    w1 = net.params['scale1'][0].data
    np.testing.assert_allclose(out['s2'], 3 * np.maximum(w1 * [[1, 2, 3], [-1, 0.5, 2]], 0), rtol=1e-6)
    assert not np.allclose(out['s2'], s2)


def test_pycaffe_lenet_script(tmp_path):
    ref = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "lenet"
    if not ref.is_dir():
        pytest.skip(f"reference data absent: {ref}")
    missing = {"Convolution", "Pooling", "InnerProduct", "SoftmaxWithLoss"} - set(layer_type_list())
    if missing:
        pytest.skip(f"layer types not implemented yet: {', '.join(sorted(missing))}")
    # -- the script, unchanged pycaffe ------------------------------------------------------------
    net = caffe.Net(str(ref / 'lenet_train_input.prototxt'), str(ref / 'lenet_iter_100.caffemodel'), caffe.TRAIN)
    net.blobs['data'].data[...] = np.load(ref / 'input_data.npy')
    net.blobs['label'].data[...] = np.load(ref / 'input_label.npy')
    out = net.forward()
    conv1 = net.blobs['conv1'].data
    net.backward()
    conv1_grad = net.params['conv1'][0].diff
    net.save(str(tmp_path / 'lenet.caffemodel'))
    deploy = caffe.Net(str(ref / 'lenet_deploy.prototxt'), str(tmp_path / 'lenet.caffemodel'), caffe.TEST)
    probs = deploy.forward(data=np.load(ref / 'input_data.npy'))['prob']
    # -- checks ----------------------------------------------------------------------------------
    assert abs(float(out['loss']) - np.load(ref / 'backward_iter100' / 'loss.npy').item()) < 1e-4
    assert conv1.shape == (64, 20, 24, 24)
    np.testing.assert_allclose(conv1_grad, np.load(ref / 'backward_iter100' / 'conv1_w_diff.npy'),
                               rtol=1e-4, atol=1e-4 * np.abs(conv1_grad).max())
    np.testing.assert_allclose(probs, np.load(ref / 'forward_iter100' / 'prob.npy'), rtol=1e-5, atol=1e-6)


def test_classifier(tmp_path):
    if "Softmax" not in layer_type_list():
        pytest.skip("layer type Softmax is not implemented yet (caffe-layers)")
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text("\n".join([input_layer("input", {"data": (1, 3, 4, 4)}),
                                 python_layer("scale", "ChannelScale", ["data"], ["s"], param_str="0.5"),
                                 'layer { name: "prob" type: "Softmax" bottom: "s" top: "prob" '
                                 'softmax_param { axis: 1 } }']))
    weights = str(tmp_path / "c.caffemodel")
    caffe.Net(str(deploy), caffe.TEST).save(weights)
    mean = np.array([0.1, 0.2, 0.3])
    clf = caffe.Classifier(str(deploy), weights, image_dims=(6, 6), mean=mean, raw_scale=2.0,
                           channel_swap=(2, 1, 0))
    rng = np.random.default_rng(3)
    images = [rng.random((5, 7, 3)).astype(np.float32) for _ in range(2)]
    center = clf.predict(images, oversample=False)
    assert center.shape == (2, 3, 4, 4)
    # the same by hand: resize to 6x6, center 4x4 crop, H x W x K -> K x H x W, BGR, * 2, - mean
    img = caffe.io.resize_image(images[0], (6, 6))[1:5, 1:5]
    x = (img.transpose(2, 0, 1)[[2, 1, 0]] * 2.0 - mean[:, None, None]) * 0.5
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(center[0], e / e.sum(0), rtol=1e-5)
    crops = clf.predict(images)  # the mean over 10 crops, flattened per image as pycaffe does
    assert crops.shape == (2, 48) and np.all(np.isfinite(crops))
