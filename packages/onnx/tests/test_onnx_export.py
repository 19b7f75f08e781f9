"""export(): unsupported layers (one error naming all), options (opset, batch, dynamic_batch), the file
written (atomic, external data for large weights), and the model's metadata."""

import numpy as np
import onnx
import pytest

import caffe
import caffe.onnx
from caffe.onnx import ExportError, UnsupportedLayersError, export, to_onnx
from caffe.onnx.testing import compare_with_onnxruntime, random_inputs, randomize, run_onnxruntime

pytest.importorskip("onnxruntime")


def net_of(body, inputs=None, phase=caffe.TEST, name="t"):
    inputs = inputs if inputs is not None else {"data": (2, 3, 4, 5)}
    head = "".join(f'layer {{ name: "{n}" type: "Input" top: "{n}" input_param {{ shape {{ '
                   f'{" ".join(f"dim: {d}" for d in s)} }} }} }}\n' for n, s in inputs.items())
    net = caffe.Net(f'name: "{name}"\n{head}{body}', phase)
    randomize(net, np.random.default_rng(0))
    return net


CONV = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 '
        'kernel_size: 3 pad: 1 } }\n')


def test_onnx_unsupported_layers_named_all_at_once(tmp_path):
    body = ('layer { name: "dummy" type: "DummyData" top: "label" dummy_data_param { shape { dim: 2 } } }\n'
            'layer { name: "py" type: "Python" bottom: "data" top: "py" python_param { module: "caffe.net.testing" '
            'layer: "ChannelScale" } }\n' + CONV +
            'layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 3 } }\n'
            'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n'
            'layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" }\n')
    net = net_of(body)
    path = tmp_path / "net.onnx"
    with pytest.raises(UnsupportedLayersError) as info:
        export(net, path)
    msg = str(info.value)
    for name, type_ in [("dummy", "DummyData"), ("py", "Python"), ("loss", "SoftmaxWithLoss"),
                        ("accuracy", "Accuracy")]:
        assert f"'{name}' ({type_})" in msg
    assert "'conv'" not in msg and "'ip'" not in msg
    assert "4 layers" in msg and "net 't'" in msg and "Input layer" in msg
    assert [n for n, _, _ in info.value.layers] == ["dummy", "py", "loss", "accuracy"]
    assert not path.exists() and not list(tmp_path.iterdir())


def test_onnx_train_phase_random_layers_refused():
    body = CONV + ('layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" }\n'
                   'layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: STOCHASTIC '
                   'kernel_size: 2 } }\n')
    with pytest.raises(UnsupportedLayersError, match=r"'drop' \(Dropout\): Dropout in the TRAIN phase.*"
                                                     r"'pool' \(Pooling\): STOCHASTIC pooling in the TRAIN phase"):
        to_onnx(net_of(body, phase=caffe.TRAIN))
    compare_with_onnxruntime(net_of(body, phase=caffe.TEST), np.random.default_rng(0))


def test_onnx_train_phase_net_without_random_layers_exports():
    body = CONV + 'layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "bn" }\n'
    compare_with_onnxruntime(net_of(body, phase=caffe.TRAIN), np.random.default_rng(0))


@pytest.mark.parametrize("opset", [13, 17, 18, None])
def test_onnx_opsets(opset):
    body = CONV + ('layer { name: "slice" type: "Slice" bottom: "conv" top: "a" top: "b" slice_param { axis: 1 } }\n'
                   'layer { name: "mean" type: "Reduction" bottom: "a" top: "m" reduction_param { operation: MEAN '
                   'axis: 2 } }\n'
                   'layer { name: "ss" type: "Reduction" bottom: "b" top: "s" reduction_param { operation: SUMSQ } }\n'
                   'layer { name: "bn" type: "BatchNorm" bottom: "b" top: "bn" batch_norm_param { use_global_stats: '
                   'false } }\n'
                   'layer { name: "am" type: "ArgMax" bottom: "bn" top: "am" '
                   'argmax_param { axis: 1 out_max_val: true } }\n')
    net = net_of(body)
    model = to_onnx(net, opset)
    assert model.opset_import[0].version == (opset or caffe.onnx.DEFAULT_OPSET)
    onnx.checker.check_model(model, full_check=True)
    compare_with_onnxruntime(net, np.random.default_rng(0), model=model)


@pytest.mark.parametrize("opset,match", [(12, "opset 12 is not supported"), (10 ** 6, "not supported"),
                                         ("x", "opset must be an integer")])
def test_onnx_bad_opset(opset, match):
    with pytest.raises(ExportError, match=match):
        to_onnx(net_of(CONV), opset)


def test_onnx_batch_option_restores_the_net():
    net = net_of(CONV + 'layer { name: "flat" type: "Flatten" bottom: "conv" top: "flat" }\n')
    model = to_onnx(net, batch=5)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [5, 3, 4, 5]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [5, 80]
    assert net.blobs["data"].shape == (2, 3, 4, 5) and net.blobs["flat"].shape == (2, 80)
    feeds = {"data": np.random.default_rng(0).normal(size=(5, 3, 4, 5)).astype(np.float32)}
    compare_with_onnxruntime(net, np.random.default_rng(0), model=model, feeds=feeds)
    with pytest.raises(ExportError, match="batch must be a positive"):
        to_onnx(net, batch=0)
    with pytest.raises(ExportError, match="exclude each other"):
        to_onnx(net, batch=2, dynamic_batch=True)


DYNAMIC = CONV + (
    'layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 3 '
    'stride: 2 pad: 1 } }\n'
    'layer { name: "flat" type: "Flatten" bottom: "pool" top: "flat" }\n'
    'layer { name: "ip" type: "InnerProduct" bottom: "flat" top: "ip" inner_product_param { num_output: 6 } }\n'
    'layer { name: "reshape" type: "Reshape" bottom: "ip" top: "r" '
    'reshape_param { shape { dim: 0 dim: 2 dim: -1 } } }\n'
    'layer { name: "ip2" type: "InnerProduct" bottom: "r" top: "ip2" inner_product_param { num_output: 2 axis: 2 } }\n'
    'layer { name: "sm" type: "Softmax" bottom: "ip2" top: "prob" softmax_param { axis: 1 } }\n'
    'layer { name: "am" type: "ArgMax" bottom: "conv" top: "am" argmax_param { top_k: 2 out_max_val: true } }\n'
    'layer { name: "cat" type: "Concat" bottom: "pool" bottom: "pool" top: "cat" concat_param { axis: 0 } }\n'
    'layer { name: "halves" type: "Slice" bottom: "cat" top: "h1" top: "h2" slice_param { axis: 0 } }\n'
    'layer { name: "cut" type: "Slice" bottom: "h1" top: "c1" top: "c2" slice_param { axis: 0 slice_point: 1 } }\n'
    'layer { name: "sum" type: "Reduction" bottom: "h2" top: "total" reduction_param { axis: 0 operation: MEAN } }\n'
    'layer { name: "tile" type: "Tile" bottom: "c2" top: "tiled" tile_param { axis: 0 tiles: 2 } }\n'
    'layer { name: "cat_out" type: "Concat" bottom: "pool" bottom: "pool" top: "cat2" concat_param { axis: 0 } }\n')


def test_onnx_dynamic_batch_runs_at_every_batch_size():
    net = net_of(DYNAMIC)
    model = to_onnx(net, dynamic_batch=True)
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert dims["prob"] == ["batch", 2, 2] and dims["am"] == ["batch", 2, 2, 1]
    assert dims["total"] == [] and dims["c1"] == [1, 4, 3, 3]
    assert dims["tiled"][0] == "tiled_dim0"  # 2 * (batch - 1): symbolic, not the batch
    assert dims["cat2"][0] == "2*batch"
    for batch in (2, 3, 5):
        feeds = {"data": np.random.default_rng(batch).normal(size=(batch, 3, 4, 5)).astype(np.float32)}
        compare_with_onnxruntime(net, np.random.default_rng(0), model=model, feeds=feeds)


@pytest.mark.parametrize("body,match", [
    ('layer { name: "crop" type: "Crop" bottom: "data" bottom: "ref" top: "c" crop_param { axis: 0 } }\n',
     r"'crop' \(Crop\): cropping the batch axis"),
    ('layer { name: "rs" type: "Reshape" bottom: "data" top: "r" reshape_param { axis: 0 num_axes: 0 '
     'shape { dim: 1 } } }\n', r"'rs' \(Reshape\): inserting axes before the batch axis"),
])
def test_onnx_dynamic_batch_refuses_batch_fixed_layers(body, match):
    net = net_of(body, {"data": (2, 3, 4, 5), "ref": (1, 3, 4, 5)})
    with pytest.raises(UnsupportedLayersError, match=match):
        to_onnx(net, dynamic_batch=True)
    compare_with_onnxruntime(net, np.random.default_rng(0))  # fine with a fixed batch


def test_onnx_dynamic_batch_needs_a_reshapable_net():
    body = 'layer { name: "rs" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 2 dim: 60 } } }\n'
    with pytest.raises(ExportError, match="does not reshape to batch 3"):
        to_onnx(net_of(body), dynamic_batch=True)


def test_onnx_export_writes_a_checked_file_and_metadata(tmp_path):
    net = net_of(CONV + 'layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n', name="MyNet")
    path = tmp_path / "net.onnx"
    path.write_bytes(b"old")
    returned = export(net, path, doc_string="from test")
    model = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    assert model == returned
    assert model.graph.name == "MyNet" and model.producer_name == "caffe-onnx" and model.doc_string == "from test"
    props = {p.key: p.value for p in model.metadata_props}
    assert props == {"caffe_net_name": "MyNet", "caffe_phase": "TEST"}
    assert [n.name for n in model.graph.node] == ["conv", "relu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.onnx"]  # no temporary file left
    compare_with_onnxruntime(net, np.random.default_rng(0), model=str(path), every_blob=False)


def test_onnx_large_weights_go_to_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(caffe.onnx.exporter, "EXTERNAL_DATA_BYTES", 100)
    net = net_of(CONV + 'layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" '
                        'inner_product_param { num_output: 50 } }\n')
    path = tmp_path / "big.onnx"
    export(net, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    assert (tmp_path / "big.onnx.data").stat().st_size >= 4 * 50 * 80
    feeds = random_inputs(net, np.random.default_rng(0))
    got = run_onnxruntime(str(path), feeds)
    np.testing.assert_allclose(got["ip"], net.forward(**feeds)["ip"], rtol=1e-4, atol=1e-5)
