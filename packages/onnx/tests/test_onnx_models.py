"""Whole architectures with random weights: ONNX Runtime's outputs (and every intermediate blob) equal
net.forward() within 1e-4 relative. LeNet and CaffeNet are Caffe's own deploy prototxts (../shared); the
GoogLeNet-, ResNet-, MobileNet- and SqueezeNet-like nets are small fixtures with those nets' layer kinds.
"""
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import caffe
from caffe.net.protofile import read_text
from caffe.onnx import to_onnx
from caffe.onnx.testing import compare_with_onnxruntime, randomize
from caffe.proto import caffe_pb2

pytest.importorskip("onnxruntime")

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = Path(__file__).resolve().parents[3].parent / "shared" / "caffe-models"
LENET = MODELS / "examples" / "mnist" / "lenet.prototxt"
CAFFENET = MODELS / "models" / "bvlc_reference_caffenet" / "deploy.prototxt"


def _shared(path):
    if not path.exists():
        pytest.skip(f"Caffe's model zoo prototxts are not next to the repository ({path} is absent)")
    return path


def small_caffenet(batch=2, size=67, shrink=8):
    """Caffe's CaffeNet deploy net with its channels divided by `shrink` and a small input (its layers,
    groups, LRN, pooling and dropout unchanged)."""
    param = read_text(str(_shared(CAFFENET)), caffe_pb2.NetParameter())
    for layer in param.layer:
        if layer.type == "Input":
            layer.input_param.shape[0].dim[:] = [batch, 3, size, size]
        elif layer.type == "Convolution":
            layer.convolution_param.num_output //= shrink
        elif layer.type == "InnerProduct":
            n = layer.inner_product_param.num_output
            layer.inner_product_param.num_output = 10 if n == 1000 else n // shrink
    return param


def _net(source, seed=0):
    net = caffe.Net(source if isinstance(source, caffe_pb2.NetParameter) else str(source), caffe.TEST)
    randomize(net, np.random.default_rng(seed))
    return net


def _check_model(net, model):
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.name == net.name
    assert {p.key: p.value for p in model.metadata_props}["caffe_net_name"] == net.name
    node_names = {n.name for n in model.graph.node}
    folded = " ".join(n.doc_string for n in model.graph.node)  # "... Scale 'name' folded in"
    missing = [n for n, layer in zip(net.layer_names, net.layers) if layer.type != "Input" and n not in node_names
               and not (layer.type == "Scale" and f"Scale '{n}' folded in" in folded)]
    assert not missing, f"layers without a node of their name: {missing}"
    assert [o.name for o in model.graph.output] == net.outputs
    for o in model.graph.output:
        assert tuple(d.dim_value for d in o.type.tensor_type.shape.dim) == net.blobs[o.name].shape
    assert [i.name for i in model.graph.input] == net.inputs


ARCHITECTURES = {
    "lenet": lambda: LENET,
    "caffenet": small_caffenet,
    "googlenet_like": lambda: FIXTURES / "googlenet_like.prototxt",
    "resnet_like": lambda: FIXTURES / "resnet_like.prototxt",
    "mobilenet_like": lambda: FIXTURES / "mobilenet_like.prototxt",
    "squeezenet_like": lambda: FIXTURES / "squeezenet_like.prototxt",
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_onnx_architecture_matches_caffe(arch):
    source = ARCHITECTURES[arch]()
    if isinstance(source, Path):
        _shared(source)
    net = _net(source)
    model = to_onnx(net)
    _check_model(net, model)
    compare_with_onnxruntime(net, np.random.default_rng(1), model=model)


def test_onnx_resnet_like_has_every_layer_kind():
    net = _net(FIXTURES / "resnet_like.prototxt")
    model = to_onnx(net)
    ops = [n.op_type for n in model.graph.node]
    assert {"Conv", "BatchNormalization", "Sum", "Relu", "MaxPool", "AveragePool", "Gemm", "Softmax"} <= set(ops)
    # every BatchNorm + Scale pair is one BatchNormalization node, named after the BatchNorm
    bn = [n for n, layer in zip(net.layer_names, net.layers) if layer.type == "BatchNorm"]
    assert sorted(n.name for n in model.graph.node if n.op_type == "BatchNormalization") == sorted(bn)
    assert "Mul" not in ops and len(bn) == 15


def test_onnx_mobilenet_like_depthwise_groups():
    net = _net(FIXTURES / "mobilenet_like.prototxt")
    model = to_onnx(net)
    groups = {n.name: a.i for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"}
    assert groups["conv2/dw"] == 8 and groups["conv5/dw"] == 32
    compare_with_onnxruntime(net, np.random.default_rng(2), model=model)


def test_onnx_caffenet_from_weights_file(tmp_path):
    """A net whose weights come from a caffemodel exports those weights (not the fillers')."""
    net = _net(small_caffenet(batch=1), seed=3)
    weights = tmp_path / "caffenet.caffemodel"
    net.save(str(weights))
    fresh = caffe.Net(small_caffenet(batch=1), caffe.TEST, weights=str(weights))
    model = to_onnx(fresh)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(init["conv1/weight"], net.params["conv1"][0].data)
    np.testing.assert_array_equal(init["fc8/bias"], net.params["fc8"][1].data)
    compare_with_onnxruntime(fresh, np.random.default_rng(4), model=model)


@pytest.mark.skipif(not os.environ.get("CAFFE_ONNX_FULL"), reason="full-size CaffeNet (61M weights, ~5 s): "
                    "set CAFFE_ONNX_FULL=1 to run it")
def test_onnx_full_caffenet(tmp_path):
    param = small_caffenet(batch=1, size=227, shrink=1)
    for layer in param.layer:
        if layer.type == "InnerProduct" and layer.name == "fc8":
            layer.inner_product_param.num_output = 1000
    net = _net(param)
    path = tmp_path / "caffenet.onnx"
    caffe.onnx.export(net, path)
    compare_with_onnxruntime(net, np.random.default_rng(5), model=str(path), every_blob=False)
