"""Caffe's legacy upgrades (upgrade_proto.cpp): V0, V1, data transforms, inputs, BatchNorm, solvers."""
import pytest
from google.protobuf import text_format

import caffe
from caffe.layers import layer_type_list
from caffe.net import Net, upgrade
from caffe.proto import caffe_pb2


def net_param(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def upgraded(text):
    param = net_param(text)
    ok = upgrade.UpgradeNetAsNeeded(param)
    return param, ok


V0_NET = """
name: 'v0net'
input: 'data' input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227
layers { layer { name: 'pad1' type: 'padding' pad: 2 } bottom: 'data' top: 'pad1' }
layers { layer { name: 'conv1' type: 'conv' num_output: 96 kernelsize: 11 stride: 4 group: 2 biasterm: false
                 weight_filler { type: 'gaussian' std: 0.01 } blobs_lr: 1 blobs_lr: 2
                 weight_decay: 1 weight_decay: 0 }
         bottom: 'pad1' top: 'conv1' }
layers { layer { name: 'pool1' type: 'pool' pool: AVE kernelsize: 3 stride: 2 } bottom: 'conv1' top: 'pool1' }
layers { layer { name: 'norm1' type: 'lrn' local_size: 5 alpha: 0.0001 beta: 0.75 } bottom: 'pool1' top: 'norm1' }
layers { layer { name: 'drop' type: 'dropout' dropout_ratio: 0.3 } bottom: 'norm1' top: 'norm1' }
layers { layer { name: 'fc' type: 'innerproduct' num_output: 10 bias_filler { type: 'constant' value: 1 } }
         bottom: 'norm1' top: 'fc' }
layers { layer { name: 'prob' type: 'softmax' } bottom: 'fc' top: 'prob' }
"""


def test_v0_net_with_padding_layer():
    param, ok = upgraded(V0_NET)
    assert ok and not upgrade.NetNeedsUpgrade(param)
    assert not len(param.layers) and not len(param.input) and not len(param.input_dim)
    names = [(l.name, l.type, list(l.bottom), list(l.top)) for l in param.layer]
    assert names == [("input", "Input", [], ["data"]), ("conv1", "Convolution", ["data"], ["conv1"]),
                     ("pool1", "Pooling", ["conv1"], ["pool1"]), ("norm1", "LRN", ["pool1"], ["norm1"]),
                     ("drop", "Dropout", ["norm1"], ["norm1"]), ("fc", "InnerProduct", ["norm1"], ["fc"]),
                     ("prob", "Softmax", ["fc"], ["prob"])]
    assert list(param.layer[0].input_param.shape[0].dim) == [10, 3, 227, 227]
    conv = param.layer[1]
    cp = conv.convolution_param
    assert (cp.num_output, list(cp.kernel_size), list(cp.stride), list(cp.pad), cp.group, cp.bias_term) == \
        (96, [11], [4], [2], 2, False)
    assert cp.weight_filler.type == "gaussian" and cp.weight_filler.std == pytest.approx(0.01)
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    pp = param.layer[2].pooling_param
    assert pp.pool == caffe_pb2.PoolingParameter.AVE and (pp.kernel_size, pp.stride) == (3, 2)
    lrn = param.layer[3].lrn_param
    assert lrn.local_size == 5 and lrn.alpha == pytest.approx(1e-4) and lrn.beta == pytest.approx(0.75)
    assert param.layer[4].dropout_param.dropout_ratio == pytest.approx(0.3)
    assert param.layer[5].inner_product_param.num_output == 10
    assert param.layer[5].inner_product_param.bias_filler.value == 1


def test_v0_data_layers_and_transform_fields():
    param, ok = upgraded("""
        layers { layer { name: 'd' type: 'data' source: 'db' batchsize: 32 meanfile: 'm.binaryproto'
                         cropsize: 227 mirror: true scale: 0.5 rand_skip: 3 } top: 'data' top: 'label' }
        layers { layer { name: 'i' type: 'images' source: 'list.txt' batchsize: 4 shuffle_images: true
                         new_height: 256 new_width: 255 } top: 'img' top: 'l2' }""")
    assert ok
    d, i = param.layer
    assert d.type == "Data" and d.data_param.source == "db" and d.data_param.batch_size == 32
    assert d.data_param.rand_skip == 3
    t = d.transform_param
    assert (t.mean_file, t.crop_size, t.mirror, t.scale) == ("m.binaryproto", 227, True, 0.5)
    assert i.type == "ImageData" and i.image_data_param.shuffle and i.image_data_param.new_height == 256
    assert i.image_data_param.new_width == 255 and i.image_data_param.batch_size == 4


def test_v0_unknown_parameter_is_reported_not_fatal(caplog):
    param, ok = upgraded("layers { layer { name: 'r' type: 'relu' num_output: 3 } bottom: 'x' top: 'x' }"
                         " input: 'x'")
    assert not ok and param.layer[-1].type == "ReLU"
    assert "Unknown parameter num_output for layer type relu" in caplog.text


def test_v0_unknown_type_and_bad_padding_are_errors():
    with pytest.raises(upgrade.UpgradeError, match="Unknown V0 layer type: 'warp'"):
        upgraded("layers { layer { name: 'w' type: 'warp' } }")
    with pytest.raises(upgrade.UpgradeError, match="Padding layer input to non-convolutional"):
        upgraded("input: 'x' layers { layer { name: 'p' type: 'padding' pad: 1 } bottom: 'x' top: 'p' } "
                 "layers { layer { name: 'r' type: 'relu' } bottom: 'p' top: 'r' }")


V1_NET = """
name: 'v1net'
layers { name: 'data' type: DATA top: 'data' top: 'label'
         data_param { source: 'db' batch_size: 64 scale: 0.00390625 mirror: true }
         include { phase: TRAIN } }
layers { name: 'conv' type: CONVOLUTION bottom: 'data' top: 'conv' blobs_lr: 1 blobs_lr: 2
         weight_decay: 1 weight_decay: 0 param: 'cw' param: 'cb' blob_share_mode: PERMISSIVE
         convolution_param { num_output: 4 kernel_size: 3 } }
layers { name: 'relu' type: RELU bottom: 'conv' top: 'conv' relu_param { negative_slope: 0.1 } }
layers { name: 'loss' type: SOFTMAX_LOSS bottom: 'conv' bottom: 'label' top: 'loss' loss_weight: 2
         loss_param { ignore_label: 3 } }
"""


def test_v1_net():
    param, ok = upgraded(V1_NET)
    assert ok and not len(param.layers)
    data, conv, relu, loss = param.layer
    assert [l.type for l in param.layer] == ["Data", "Convolution", "ReLU", "SoftmaxWithLoss"]
    # the data transform fields moved first, then the layer was upgraded
    assert data.transform_param.scale == pytest.approx(1 / 256) and data.transform_param.mirror
    assert not data.data_param.HasField("scale") and data.data_param.batch_size == 64
    assert data.include[0].phase == caffe.TRAIN
    assert [(p.name, p.lr_mult, p.decay_mult) for p in conv.param] == [("cw", 1, 1), ("cb", 2, 0)]
    assert conv.param[0].share_mode == caffe_pb2.ParamSpec.PERMISSIVE
    assert not conv.param[1].HasField("share_mode")
    assert conv.convolution_param.num_output == 4
    assert relu.relu_param.negative_slope == pytest.approx(0.1)
    assert list(loss.loss_weight) == [2] and loss.loss_param.ignore_label == 3


def test_every_v1_type_has_a_name():
    enum = caffe_pb2.V1LayerParameter.LayerType
    names = {v: upgrade.UpgradeV1LayerType(v) for v in enum.values()}
    assert names[enum.Value("NONE")] == ""
    assert all(names[v] for v in enum.values() if v != enum.Value("NONE"))
    assert len(set(names.values())) == len(names)
    assert names[enum.Value("SOFTMAX_LOSS")] == "SoftmaxWithLoss" and names[enum.Value("TANH")] == "TanH"
    assert names[enum.Value("HDF5_DATA")] == "HDF5Data" and names[enum.Value("IM2COL")] == "Im2col"
    for name in ("ReLU", "Input", "Python"):  # the registered names agree with Caffe's
        assert name in layer_type_list()
    with pytest.raises(upgrade.UpgradeError, match="Unknown V1LayerParameter layer type: 999"):
        upgrade.UpgradeV1LayerType(999)


def test_layer_and_layers_together_is_refused():
    with pytest.raises(upgrade.UpgradeError, match="both 'layer' and 'layers'"):
        upgraded("layer { name: 'a' type: 'ReLU' } layers { name: 'b' type: RELU }")


@pytest.mark.parametrize("inputs,expected", [
    ("input: 'a' input_shape { dim: 2 dim: 3 } input: 'b' input_shape { dim: 4 }", [[2, 3], [4]]),
    ("input: 'a' input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4", [[1, 2, 3, 4]]),
])
def test_input_fields_become_an_input_layer(inputs, expected):
    param, ok = upgraded(inputs + " layer { name: 'r' type: 'ReLU' bottom: 'a' top: 'r' }")
    assert ok and not len(param.input) and not len(param.input_shape) and not len(param.input_dim)
    first = param.layer[0]
    assert (first.name, first.type) == ("input", "Input") and param.layer[1].name == "r"
    assert [list(s.dim) for s in first.input_param.shape] == expected


def test_bare_input_field_is_dropped_and_bad_inputs_rejected():
    param, _ = upgraded("input: 'data' layer { name: 'r' type: 'ReLU' }")
    assert [l.name for l in param.layer] == ["r"] and not len(param.input)
    with pytest.raises(upgrade.UpgradeError, match="input_dim"):
        upgraded("input: 'a' input_dim: 1 input_dim: 2")
    with pytest.raises(upgrade.UpgradeError, match="input_shape OR deprecated input_dim"):
        upgraded("input: 'a' input_shape { dim: 1 } input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1")


def test_old_batch_norm_param_specs_get_zero_rates_and_keep_names():
    param, ok = upgraded("""
        layer { name: 'bn' type: 'BatchNorm' param { lr_mult: 1 decay_mult: 1 name: 'm' }
                param { lr_mult: 1 name: 's' } param { name: 'b' } }
        layer { name: 'bn2' type: 'BatchNorm' }""")
    assert ok
    assert [(p.name, p.lr_mult, p.decay_mult) for p in param.layer[0].param] == \
        [("m", 0, 0), ("s", 0, 0), ("b", 0, 0)]
    assert not len(param.layer[1].param)


def test_net_needs_upgrade():
    assert not upgrade.NetNeedsUpgrade(net_param("layer { name: 'a' type: 'ReLU' }"))
    for text in (V0_NET, V1_NET, "input: 'x'",
                 "layer { name: 'bn' type: 'BatchNorm' param {} param {} param {} }"):
        assert upgrade.NetNeedsUpgrade(net_param(text))


def test_net_builds_from_a_v1_prototxt_file(tmp_path):
    path = tmp_path / "v1.prototxt"
    path.write_text("name: 'old' input: 'data' input_dim: 2 input_dim: 3 input_dim: 1 input_dim: 1 "
                    "layers { name: 'relu' type: RELU bottom: 'data' top: 'out' }")
    net = Net(str(path), caffe.TEST)
    assert net.layer_names == ["input", "relu"] and net.inputs == ["data"] and net.outputs == ["out"]
    assert net.blobs["data"].shape == (2, 3, 1, 1)


def test_solver_type_upgrade(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text("solver_type: ADAM base_lr: 0.1")
    param = upgrade.ReadSolverParamsFromTextFileOrDie(path)
    assert param.type == "Adam" and not param.HasField("solver_type")
    assert param.snapshot_prefix == str(tmp_path / "solver")  # unset: the solver file without extension
    both = caffe_pb2.SolverParameter(type="SGD", solver_type=caffe_pb2.SolverParameter.NESTEROV)
    with pytest.raises(upgrade.UpgradeError, match="cannot be both specified"):
        upgrade.UpgradeSolverType(both)
    for enum, name in [("SGD", "SGD"), ("NESTEROV", "Nesterov"), ("ADAGRAD", "AdaGrad"),
                       ("RMSPROP", "RMSProp"), ("ADADELTA", "AdaDelta")]:
        p = caffe_pb2.SolverParameter(solver_type=caffe_pb2.SolverParameter.SolverType.Value(enum))
        assert upgrade.UpgradeSolverAsNeeded("x", p) and p.type == name


def test_snapshot_prefix_directory(tmp_path):
    (tmp_path / "snaps").mkdir()
    path = tmp_path / "lenet_solver.prototxt"
    path.write_text(f"snapshot_prefix: '{tmp_path / 'snaps'}'")
    assert upgrade.ReadSolverParamsFromTextFileOrDie(path).snapshot_prefix == str(tmp_path / "snaps" / "lenet_solver")
    path.write_text("snapshot_prefix: 'snaps/lenet'")
    assert upgrade.ReadSolverParamsFromTextFileOrDie(path).snapshot_prefix == "snaps/lenet"
