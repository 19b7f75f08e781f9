"""caffe.net_spec (pycaffe's NetSpec): names and automatic names as pycaffe assigns them, where keyword
parameters land, ntop / in_place, and the errors. Net construction from these specs is tested in
caffe-net (test_net_pycaffe_surface.py)."""
import re

import pytest
from google.protobuf import text_format
from hypothesis import given, strategies as st

import caffe
from caffe import params as P
from caffe.net_spec import NetSpec, Function, Top, layers as L, to_proto
from caffe.proto import caffe_pb2


def summary(net):
    return [(l.name, l.type, list(l.bottom), list(l.top)) for l in net.layer]


def named_lenet():
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[8, 1, 28, 28]), dict(dim=[8, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool1, num_output=50, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10)
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n


def test_assigned_names_name_tops_and_their_layers():
    assert summary(named_lenet().to_proto()) == [
        ("data", "DummyData", [], ["data", "label"]),
        ("conv1", "Convolution", ["data"], ["conv1"]),
        ("pool1", "Pooling", ["conv1"], ["pool1"]),
        ("ip1", "InnerProduct", ["pool1"], ["ip1"]),
        ("relu1", "ReLU", ["ip1"], ["ip1"]),  # in place: the layer keeps its name, writes its bottom
        ("ip2", "InnerProduct", ["ip1"], ["ip2"]),
        ("loss", "SoftmaxWithLoss", ["ip2", "label"], ["loss"]),
    ]


def test_anonymous_names_count_per_type_in_visiting_order():
    data, label = L.DummyData(ntop=2)
    conv = L.Convolution(data, kernel_size=3, num_output=4)
    conv2 = L.Convolution(conv, kernel_size=3, num_output=4)
    relu = L.ReLU(conv2, in_place=True)
    loss = L.EuclideanLoss(relu, label)
    assert summary(loss.to_proto()) == [
        ("DummyData1", "DummyData", [], ["DummyData1", "DummyData2"]),  # both tops counted under the type
        ("Convolution1", "Convolution", ["DummyData1"], ["Convolution1"]),
        ("Convolution2", "Convolution", ["Convolution1"], ["Convolution2"]),
        ("ReLU1", "ReLU", ["Convolution2"], ["Convolution2"]),
        ("EuclideanLoss1", "EuclideanLoss", ["Convolution2", "DummyData2"], ["EuclideanLoss1"]),
    ]
    assert summary(to_proto(loss)) == summary(loss.to_proto())


def test_mixed_names_and_topless_layers():
    n = NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    hidden = L.Convolution(n.data, kernel_size=1, num_output=2)  # not assigned: auto-named
    n.out = L.ReLU(hidden)
    n.silence = L.Silence(n.data2, ntop=0)  # a Function, named by its attribute
    L.Silence(n.out, ntop=0)  # unreachable from the spec: not generated
    assert summary(n.to_proto()) == [
        ("data", "DummyData", [], ["data", "data2"]),
        ("Convolution1", "Convolution", ["data"], ["Convolution1"]),
        ("out", "ReLU", ["Convolution1"], ["out"]),
        ("silence", "Silence", ["data2"], []),
    ]


def test_parameters_land_in_the_right_messages():
    proto = named_lenet().to_proto()
    data, conv, pool = proto.layer[0], proto.layer[1], proto.layer[2]
    assert [list(s.dim) for s in data.dummy_data_param.shape] == [[8, 1, 28, 28], [8, 1, 1, 1]]
    assert data.transform_param.scale == pytest.approx(1 / 255)
    assert list(conv.convolution_param.kernel_size) == [5]  # a scalar for a repeated field
    assert conv.convolution_param.num_output == 20 and conv.convolution_param.weight_filler.type == "xavier"
    assert pool.pooling_param.pool == caffe_pb2.PoolingParameter.MAX and pool.pooling_param.kernel_size == 2
    top = L.Convolution(L.Input(shape=dict(dim=[1, 1, 4, 4])), kernel_size=[3, 1], num_output=1,
                        param=[dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)],
                        include=dict(phase=caffe.TRAIN), loss_weight=0.5, name="explicit",
                        propagate_down=(True,))
    layer = top.to_proto().layer[1]
    assert layer.name == "explicit"  # a name parameter overrides the generated one, as pycaffe's
    assert [(p.lr_mult, p.decay_mult) for p in layer.param] == [(1, 1), (2, 0)]
    assert layer.include[0].phase == caffe.TRAIN and list(layer.loss_weight) == [0.5]
    assert list(layer.convolution_param.kernel_size) == [3, 1] and list(layer.propagate_down) == [True]
    py = L.Python(module="my_layers", layer="MyData", param_str=str(dict(batch_size=2)), ntop=2)[0]
    pp = py.to_proto().layer[0].python_param
    assert (pp.module, pp.layer, pp.param_str) == ("my_layers", "MyData", "{'batch_size': 2}")
    data = L.Data(source="x_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2)[0].to_proto().layer[0]
    assert data.data_param.backend == caffe_pb2.DataParameter.LMDB and data.data_param.source == "x_lmdb"
    h5 = L.HDF5Data(batch_size=10, source="train.txt", ntop=2)[0].to_proto().layer[0]
    assert h5.hdf5_data_param.batch_size == 10


def test_layers_sharing_another_types_message():
    # pycaffe has no entry for these; here Deconvolution and Im2col fill convolution_param, losses loss_param
    up = L.Deconvolution(L.Input(shape=dict(dim=[1, 2, 4, 4])), num_output=2, kernel_size=4, stride=2)
    assert up.to_proto().layer[1].convolution_param.num_output == 2
    loss = L.SoftmaxWithLoss(L.Input(shape=dict(dim=[2, 3])), L.Input(shape=dict(dim=[2])), axis=1,
                             ignore_label=-1, normalization=P.Loss.VALID)
    layer = loss.to_proto().layer[-1]
    assert layer.softmax_param.axis == 1 and layer.loss_param.ignore_label == -1
    assert layer.loss_param.normalization == caffe_pb2.LossParameter.VALID
    lstm = L.LSTM(L.Input(shape=dict(dim=[3, 1, 2])), L.Input(shape=dict(dim=[3, 1])), num_output=5)
    assert lstm.to_proto().layer[-1].recurrent_param.num_output == 5


def test_ntop_and_in_place():
    assert isinstance(L.Silence(L.DummyData(), ntop=0), Function)
    tops = L.Slice(L.DummyData(), ntop=3)
    assert isinstance(tops, tuple) and len(tops) == 3 and all(isinstance(t, Top) for t in tops)
    assert [t.n for t in tops] == [0, 1, 2] and tops[0].fn is tops[2].fn
    fn = L.ReLU(L.DummyData(), in_place=True).fn
    assert fn.in_place and "in_place" not in fn.params and "ntop" not in fn.params


def test_errors_name_what_is_wrong():
    data = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class 'tuple'>\)$"):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)
    with pytest.raises(AttributeError, match="Convolution layer 'Convolution1': unknown parameter 'kernal_size'"):
        L.Convolution(L.DummyData(), kernal_size=3).to_proto()
    with pytest.raises(AttributeError, match="FillerParameter has no field 'kind'"):
        L.Convolution(L.DummyData(), weight_filler=dict(kind="xavier")).to_proto()
    with pytest.raises(TypeError, match="num_output"):
        L.InnerProduct(L.DummyData(), num_output="ten").to_proto()
    with pytest.raises(ValueError, match="ntop must be a non-negative integer"):
        L.DummyData(ntop=-1)
    with pytest.raises(AttributeError, match="PoolingParameter has no enum value MAXX"):
        P.Pooling.MAXX
    with pytest.raises(AttributeError, match="no message NopeParameter"):
        P.Nope.X
    n = NetSpec()
    with pytest.raises(AttributeError, match="NetSpec has no top named 'nothing'"):
        n.nothing
    with pytest.raises(KeyError):
        n["nothing"]


def test_netspec_items_and_pycaffe_names():
    n = NetSpec()
    n["data"] = L.Input(shape=dict(dim=[1, 3]))
    n.__setattr__("fc", L.InnerProduct(n.data, num_output=2))  # as 02-fine-tuning names its classifier
    assert n.fc is n["fc"] and "fc" in n and list(n.tops) == ["data", "fc"]
    del n.fc
    assert list(n.tops) == ["data"]
    assert caffe.NetSpec is NetSpec and caffe.params.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert caffe.to_proto is to_proto
    assert P.Data.LEVELDB == caffe_pb2.DataParameter.LEVELDB


def test_generated_text_parses_back():
    proto = named_lenet().to_proto()
    again = text_format.Parse(str(proto), caffe_pb2.NetParameter())
    assert again == proto


# -- property: random nets -------------------------------------------------------------------------------

TYPES = ["Convolution", "ReLU", "Pooling", "Eltwise", "Concat"]


@st.composite
def random_specs(draw):
    """A random DAG of layers over one data layer, each top assigned a name or left anonymous."""
    n_layers = draw(st.integers(1, 8))
    steps = []
    for i in range(n_layers):
        kind = draw(st.sampled_from(TYPES))
        arity = 2 if kind in ("Eltwise", "Concat") else 1
        inputs = [draw(st.integers(0, i)) for _ in range(arity)]  # 0: data, k: the k-th layer's top
        steps.append((kind, inputs, draw(st.booleans()), kind == "ReLU" and draw(st.booleans())))
    return steps


@given(random_specs())
def test_random_specs_are_well_formed(steps):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2, 4, 4]))
    tops = [n.data]
    assigned = {}
    for i, (kind, inputs, named, in_place) in enumerate(steps):
        top = getattr(L, kind)(*[tops[j] for j in inputs], in_place=in_place)
        tops.append(top)
        if named:
            n[f"t{i}"] = top
            assigned[top] = f"t{i}"
    n.out = L.Silence(*tops[1:], ntop=0)  # keep every layer reachable
    proto = n.to_proto()
    produced = set()
    per_type = {}
    for layer in proto.layer:
        for b in layer.bottom:
            assert b in produced, (b, layer.name)  # bottoms come from earlier layers
        produced.update(layer.top)
        m = re.fullmatch(rf"{layer.type}(\d+)", layer.name)
        if m:  # automatic names count up per type in generation order
            k = int(m.group(1))
            assert k > per_type.get(layer.type, 0)
            per_type[layer.type] = k
    names = [l.name for l in proto.layer]
    assert len(names) == len(set(names)) == len(steps) + 2
    for top, name in assigned.items():
        layer = next(l for l in proto.layer if l.name == name)  # an assigned top names its layer
        assert layer.type == top.fn.type_name
        if not top.fn.in_place:
            assert list(layer.top) == [name]
