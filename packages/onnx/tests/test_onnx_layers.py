"""Each supported layer type, with its parameters, against net.forward() (every blob compared)."""

import numpy as np
import onnx
import pytest

import caffe
from caffe.onnx import to_onnx
from caffe.onnx.testing import compare_with_onnxruntime, randomize

pytest.importorskip("onnxruntime")


def net_of(body, inputs=None, phase=caffe.TEST, name="t", seed=0):
    inputs = inputs or {"data": (2, 3, 4, 5)}
    head = "".join(f'layer {{ name: "{n}" type: "Input" top: "{n}" input_param {{ shape {{ '
                   f'{" ".join(f"dim: {d}" for d in s)} }} }} }}\n' for n, s in inputs.items())
    net = caffe.Net(f'name: "{name}"\n{head}{body}', phase)
    randomize(net, np.random.default_rng(seed))
    return net


def L(name, type_, bottoms, tops, params=""):
    b = " ".join(f'bottom: "{x}"' for x in ([bottoms] if isinstance(bottoms, str) else bottoms))
    t = " ".join(f'top: "{x}"' for x in ([tops] if isinstance(tops, str) else tops))
    return f'layer {{ name: "{name}" type: "{type_}" {b} {t} {params} }}\n'


NEURONS = [
    ("ReLU", ""), ("ReLU", "relu_param { negative_slope: 0.1 }"), ("ReLU", "relu_param { negative_slope: -2 }"),
    ("PReLU", ""), ("PReLU", "prelu_param { channel_shared: true }"),
    ("ELU", ""), ("ELU", "elu_param { alpha: 0.3 }"), ("Sigmoid", ""), ("TanH", ""), ("AbsVal", ""),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }"), ("Power", "power_param { power: 1 scale: -3 }"),
    ("Power", "power_param { power: 3 }"), ("Power", "power_param { power: 0 scale: 2 }"),
    ("Power", "power_param { power: 2 scale: 0 shift: 3 }"), ("Power", ""),
    ("Exp", ""), ("Exp", "exp_param { base: 2 scale: 0.5 shift: 1 }"), ("Exp", "exp_param { shift: -1 }"),
    ("BNLL", ""), ("Threshold", "threshold_param { threshold: 0.2 }"), ("Threshold", ""),
    ("Clip", "clip_param { min: -0.3 max: 0.5 }"), ("Swish", ""), ("Swish", "swish_param { beta: 2.5 }"),
    ("Dropout", ""), ("Dropout", "dropout_param { dropout_ratio: 0.3 }"),
]


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("type_,params", NEURONS)
def test_onnx_neuron(type_, params, inplace):
    if inplace and type_ == "AbsVal":
        pytest.skip("Caffe's AbsVal does not run in place")
    top = "data2" if inplace else "y"
    body = L("pre", "Scale", "data", "data2", "scale_param { filler { type: 'constant' value: 3 } }")
    body += L("neuron", type_, "data2", top, params)
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["", "log_param { base: 10 scale: 2 shift: 0.5 }", "log_param { base: 2 }"])
def test_onnx_log(params):
    body = L("abs", "AbsVal", "data", "a") + L("shift", "Power", "a", "p", "power_param { shift: 0.1 }")
    body += L("log", "Log", "p", "y", params)
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


@pytest.mark.filterwarnings("ignore:invalid value")
def test_onnx_power_fractional_and_negative_base():
    """A fractional power of a negative base is NaN in both (C's pow)."""
    body = L("pow", "Power", "data", "y", "power_param { power: 0.5 shift: 0.2 }")
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


@pytest.mark.parametrize("params", [
    "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }",
    "lrn_param { local_size: 3 alpha: 2 beta: 0.5 k: 2 }",
    "lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL }",
    "lrn_param { local_size: 5 alpha: 1 beta: 1.5 norm_region: WITHIN_CHANNEL }",
])
def test_onnx_lrn(params):
    net = net_of(L("lrn", "LRN", "data", "y", params), {"data": (2, 7, 6, 5)})
    feeds = {"data": np.random.default_rng(1).normal(0, 3, (2, 7, 6, 5)).astype(np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(0), feeds=feeds)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (2, 3, 2, 2, 2)])
@pytest.mark.parametrize("stats", ["", "batch_norm_param { use_global_stats: false }",
                                   "batch_norm_param { eps: 0.1 }"])
def test_onnx_batch_norm(shape, stats):
    body = L("bn", "BatchNorm", "data", "x", stats) + L("sc", "Scale", "x", "x", "scale_param { bias_term: true }")
    compare_with_onnxruntime(net_of(body, {"data": shape}), np.random.default_rng(0))


def test_onnx_batch_norm_scale_folding():
    """BatchNorm + Scale is one node when only the Scale reads the BatchNorm's output; otherwise two."""
    fold = L("bn", "BatchNorm", "data", "x") + L("sc", "Scale", "x", "x", "scale_param { bias_term: true }")
    nofold = L("bn", "BatchNorm", "data", "x") + L("sc", "Scale", "x", "y") + L("relu", "ReLU", "x", "z")
    shared = L("bn", "BatchNorm", "data", "x") + L("sc", "Scale", "x", "y", "scale_param { axis: 0 num_axes: 2 }")
    for body, ops in [(fold, ["BatchNormalization"]),
                      (nofold, ["BatchNormalization", "Identity", "Identity", "Mul", "Relu"]),
                      (shared, ["BatchNormalization", "Mul"])]:
        net = net_of(body)
        model = to_onnx(net)
        assert [n.op_type for n in model.graph.node] == ops
        assert model.graph.node[0].name == "bn"
        compare_with_onnxruntime(net, np.random.default_rng(0), model=model)
    assert "Scale 'sc' folded in" in to_onnx(net_of(fold)).graph.node[0].doc_string


def test_onnx_batch_norm_blobs2_scale_factor():
    """The statistics in use are blobs[0] and blobs[1] over blobs[2]; a zero factor means zero stats."""
    for factor in (7.0, 0.0):
        net = net_of(L("bn", "BatchNorm", "data", "y"))
        net.params["bn"][2].data[...] = factor
        compare_with_onnxruntime(net, np.random.default_rng(0))


def test_onnx_batch_norm_in_train_phase_uses_batch_statistics():
    net = net_of(L("bn", "BatchNorm", "data", "y"), phase=caffe.TRAIN)
    compare_with_onnxruntime(net, np.random.default_rng(0))


@pytest.mark.parametrize("type_", ["Scale", "Bias"])
@pytest.mark.parametrize("params,operand", [
    ("", None), ("axis: 0", None), ("axis: 1 num_axes: 2", None), ("axis: -2", None), ("num_axes: 0", None),
    ("axis: 2 num_axes: -1", None), ("", (3,)), ("axis: 0", (2, 3)), ("axis: 2", (4, 5)), ("", ()),
])
def test_onnx_scale_bias(type_, params, operand):
    field = "scale_param" if type_ == "Scale" else "bias_param"
    inputs = {"data": (2, 3, 4, 5)}
    bottoms = ["data"]
    if operand is not None:
        inputs["s"] = operand
        bottoms.append("s")
    extra = " bias_term: true" if type_ == "Scale" else ""
    body = L("op", type_, bottoms, "y", f"{field} {{ {params}{extra} }}")
    compare_with_onnxruntime(net_of(body, inputs), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["", "inner_product_param { transpose: true }", "axis: 2", "axis: 2 transpose: true",
                                    "axis: -1", "bias_term: false", "axis: 0"])
def test_onnx_inner_product(params):
    if params and "inner_product_param" not in params:
        params = f"inner_product_param {{ {params} }}"
    params = params.replace("inner_product_param {", "inner_product_param { num_output: 6") if params else \
        "inner_product_param { num_output: 6 }"
    compare_with_onnxruntime(net_of(L("ip", "InnerProduct", "data", "y", params)), np.random.default_rng(0))


@pytest.mark.parametrize("axis", [1, 0, -1, 3])
def test_onnx_softmax(axis):
    body = L("sm", "Softmax", "data", "y", f"softmax_param {{ axis: {axis} }}")
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


def test_onnx_concat_slice_split():
    body = L("slice", "Slice", "data", ["a", "b", "c"], "slice_param { axis: 1 slice_point: 1 slice_point: 2 }")
    body += L("slice_even", "Slice", "data", ["e", "f"], "slice_param { axis: 0 }")
    body += L("slice_dim", "Slice", "data", ["g", "h"], "slice_param { slice_dim: 3 slice_point: 2 }")
    body += L("slice_one", "Slice", "a", "a1")
    body += L("concat", "Concat", ["c", "a", "b"], "cat", "concat_param { axis: -3 }")
    body += L("concat0", "Concat", ["e", "f", "e"], "cat0", "concat_param { concat_dim: 0 }")
    body += L("concat_one", "Concat", "g", "g1")
    body += L("split", "Split", "h", ["h1", "h2"])
    body += L("sum", "Eltwise", ["h1", "h2"], "hh")
    compare_with_onnxruntime(net_of(body, {"data": (4, 3, 4, 5)}), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["", "eltwise_param { operation: SUM coeff: 0.5 coeff: -2 coeff: 3 }",
                                    "eltwise_param { operation: PROD }", "eltwise_param { operation: MAX }"])
def test_onnx_eltwise(params):
    body = L("relu", "ReLU", "data", "r") + L("tanh", "TanH", "data", "t")
    body += L("elt", "Eltwise", ["data", "r", "t"], "y", params)
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["", "flatten_param { axis: 2 }", "flatten_param { axis: 0 }",
                                    "flatten_param { axis: 1 end_axis: 2 }", "flatten_param { axis: -2 end_axis: -1 }"])
def test_onnx_flatten(params):
    compare_with_onnxruntime(net_of(L("flat", "Flatten", "data", "y", params)), np.random.default_rng(0))


@pytest.mark.parametrize("params", [
    "shape { dim: 0 dim: -1 }", "shape { dim: 0 dim: 0 dim: 20 }", "shape { dim: -1 dim: 5 }",
    "shape { dim: 2 dim: 3 dim: 2 dim: 2 dim: 5 }", "axis: 1 shape { dim: 60 }",
    "axis: 2 num_axes: 1 shape { dim: 2 dim: 2 }",
    "axis: -1 shape { dim: 1 dim: 1 }", "axis: 0 num_axes: 0 shape { dim: 1 }", "axis: 1 num_axes: 0 shape { dim: 1 }",
    "axis: 0 num_axes: 2 shape { dim: 0 dim: -1 }", "shape { dim: 0 dim: 3 dim: -1 }",
])
def test_onnx_reshape(params):
    compare_with_onnxruntime(net_of(L("reshape", "Reshape", "data", "y", f"reshape_param {{ {params} }}")),
                             np.random.default_rng(0))


@pytest.mark.parametrize("params,ref", [("", (2, 3, 2, 3)), ("crop_param { axis: 1 offset: 1 }", (2, 2, 3, 3)),
                                        ("crop_param { axis: 2 offset: 1 offset: 2 }", (1, 1, 2, 3)),
                                        ("crop_param { axis: 0 offset: 1 }", (1, 2, 3, 4))])
def test_onnx_crop(params, ref):
    body = L("crop", "Crop", ["data", "ref"], "y", params)
    compare_with_onnxruntime(net_of(body, {"data": (2, 3, 4, 5), "ref": ref}), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["tile_param { tiles: 3 }", "tile_param { axis: 0 tiles: 2 }",
                                    "tile_param { axis: -1 tiles: 2 }", "tile_param { axis: 2 tiles: 1 }"])
def test_onnx_tile(params):
    compare_with_onnxruntime(net_of(L("tile", "Tile", "data", "y", params)), np.random.default_rng(0))


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis,coeff", [(0, 1), (1, 0.5), (-1, -2), (2, 1)])
def test_onnx_reduction(op, axis, coeff):
    body = L("red", "Reduction", "data", "y", f"reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}")
    compare_with_onnxruntime(net_of(body), np.random.default_rng(0))


@pytest.mark.parametrize("params", ["", "argmax_param { top_k: 3 }", "argmax_param { out_max_val: true }",
                                    "argmax_param { top_k: 2 out_max_val: true }", "argmax_param { axis: 1 }",
                                    "argmax_param { axis: 1 top_k: 2 }", "argmax_param { axis: -1 out_max_val: true }",
                                    "argmax_param { axis: 3 top_k: 3 out_max_val: true }", "argmax_param { axis: 0 }"])
def test_onnx_argmax_with_ties(params):
    """Ties rank the larger index first (Caffe's std::greater over (value, index) pairs)."""
    net = net_of(L("argmax", "ArgMax", "data", "y", params))
    feeds = {"data": np.random.default_rng(2).integers(0, 3, (2, 3, 4, 5)).astype(np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(0), feeds=feeds)


def test_onnx_mvn():
    for params in ["", "mvn_param { across_channels: true }", "mvn_param { normalize_variance: false }",
                   "mvn_param { eps: 0.01 across_channels: true }"]:
        compare_with_onnxruntime(net_of(L("mvn", "MVN", "data", "y", params)), np.random.default_rng(0))


def test_onnx_embed_and_batch_reindex():
    body = L("embed", "Embed", "idx", "e", "embed_param { num_output: 4 input_dim: 7 }")
    body += L("embed_nb", "Embed", "idx", "e2", "embed_param { num_output: 3 input_dim: 7 bias_term: false }")
    body += L("reindex", "BatchReindex", ["data", "perm"], "r")
    net = net_of(body, {"idx": (2, 3), "data": (3, 2, 2), "perm": (4,)})
    feeds = {"idx": np.array([[0, 6, 3], [2, 2, 5]], np.float32),
             "data": np.arange(12, dtype=np.float32).reshape(3, 2, 2),
             "perm": np.array([2, 0, 0, 1], np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(0), feeds=feeds)


def test_onnx_parameter_and_silence():
    body = 'layer { name: "p" type: "Parameter" top: "p" parameter_param { shape { dim: 2 dim: 3 } } }\n'
    body += L("silence", "Silence", "data", [])
    body += L("add", "Bias", ["p", "v"], "y", "bias_param { axis: 1 }")
    net = net_of(body, {"data": (2, 2), "v": (3,)})
    net.params["p"][0].data[...] = np.arange(6).reshape(2, 3)
    compare_with_onnxruntime(net, np.random.default_rng(0))


def test_onnx_in_place_chain_and_renamed_blobs():
    """A blob written by several in-place layers: each write is its own tensor, the last under the blob's name;
    a blob consumed twice gets Caffe's Split, and the outputs keep their blob names."""
    body = L("conv", "Convolution", "data", "x", "convolution_param { num_output: 4 kernel_size: 3 pad: 1 }")
    body += L("bn", "BatchNorm", "x", "x") + L("scale", "Scale", "x", "x", "scale_param { bias_term: true }")
    body += L("relu", "ReLU", "x", "x") + L("drop", "Dropout", "x", "x")
    body += L("pool", "Pooling", "x", "p", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }")
    body += L("sig", "Sigmoid", "x", "s") + L("tanh", "TanH", "x", "x2")
    net = net_of(body)
    model = to_onnx(net)
    assert [o.name for o in model.graph.output] == net.outputs == ["p", "s", "x2"]
    writers = {o: n.name for n in model.graph.node for o in n.output}
    assert writers["x"] == "drop" and writers["x/conv"] == "conv" and writers["x/relu"] == "relu"
    compare_with_onnxruntime(net, np.random.default_rng(0), model=model)


def test_onnx_float64_net():
    """A float64 net exports as DOUBLE tensors (ONNX Runtime has no double Conv: an InnerProduct net here)."""
    net = caffe.Net('name: "d"\nlayer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 2 '
                    'dim: 3 dim: 3 } } }\n'
                    + L("ip", "InnerProduct", "data", "h", "inner_product_param { num_output: 4 }")
                    + L("relu", "ReLU", "h", "h") + L("prob", "Softmax", "h", "y"), caffe.TEST, dtype=np.float64)
    randomize(net, np.random.default_rng(0))
    model = to_onnx(net)
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    compare_with_onnxruntime(net, np.random.default_rng(0), model=model, rtol=1e-12)


def test_onnx_input_written_in_place_and_output():
    """A net whose output is its input blob written in place: the graph input keeps the blob's name (what
    callers feed), so the output, a different ONNX value, gets a suffixed name."""
    net = net_of(L("relu", "ReLU", "data", "data"))
    model = to_onnx(net)
    assert [i.name for i in model.graph.input] == ["data"]
    assert [o.name for o in model.graph.output] == ["data_1"]
    from caffe.onnx.testing import caffe_forward, run_onnxruntime
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    got = run_onnxruntime(model, {"data": x})["data_1"]
    np.testing.assert_allclose(got, caffe_forward(net, {"data": x})["data"])
