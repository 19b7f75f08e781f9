"""FilterNet (NetState vs include/exclude rules) and InsertSplits (Caffe's automatic Split layers)."""
import pytest
from google.protobuf import text_format

import caffe
from caffe.net import FilterNet, InsertSplits, Net, NetError, StateMeetsRule
from caffe.net.testing import ensure_split_layer
from caffe.proto import caffe_pb2

ensure_split_layer()


def net_param(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def state(phase=caffe.TRAIN, level=0, stages=()):
    return caffe_pb2.NetState(phase=phase, level=level, stage=list(stages))


def rule(text):
    return text_format.Parse(text, caffe_pb2.NetStateRule())


@pytest.mark.parametrize("rule_text,st,meets", [
    ("", state(), True),
    ("phase: TRAIN", state(caffe.TRAIN), True),
    ("phase: TRAIN", state(caffe.TEST), False),
    ("min_level: 2", state(level=2), True),
    ("min_level: 2", state(level=1), False),
    ("max_level: 2", state(level=3), False),
    ("max_level: 2", state(level=-5), True),
    ("min_level: 0 max_level: 0", state(level=0), True),
    ("stage: 'a' stage: 'b'", state(stages=["b", "a", "c"]), True),   # needs ALL of the stages
    ("stage: 'a' stage: 'b'", state(stages=["a"]), False),
    ("not_stage: 'a'", state(stages=["b"]), True),                    # needs NONE of the not_stages
    ("not_stage: 'a' not_stage: 'x'", state(stages=["b", "x"]), False),
    ("phase: TEST stage: 's' not_stage: 't' min_level: 1", state(caffe.TEST, 1, ["s"]), True),
    ("phase: TEST stage: 's' not_stage: 't' min_level: 1", state(caffe.TEST, 1, ["s", "t"]), False),
])
def test_state_meets_rule(rule_text, st, meets):
    assert StateMeetsRule(st, rule(rule_text), "layer") is meets


FILTER_NET = """
name: 'f'
layer { name: 'always' type: 'Input' top: 'a' }
layer { name: 'train_only' type: 'Input' top: 'b' include { phase: TRAIN } }
layer { name: 'test_or_stage' type: 'Input' top: 'c' include { phase: TEST } include { stage: 'deploy' } }
layer { name: 'not_level2' type: 'Input' top: 'd' exclude { min_level: 2 } }
layer { name: 'not_excluded_twice' type: 'Input' top: 'e' exclude { phase: TEST } exclude { stage: 'x' } }
"""


@pytest.mark.parametrize("phase,level,stages,kept", [
    (caffe.TRAIN, 0, [], ["always", "train_only", "not_level2", "not_excluded_twice"]),
    (caffe.TEST, 0, [], ["always", "test_or_stage", "not_level2"]),
    (caffe.TRAIN, 2, ["deploy"], ["always", "train_only", "test_or_stage", "not_excluded_twice"]),
    (caffe.TRAIN, 0, ["x"], ["always", "train_only", "not_level2"]),
])
def test_filter_net(phase, level, stages, kept):
    param = net_param(FILTER_NET)
    param.state.CopyFrom(state(phase, level, stages))
    assert [l.name for l in FilterNet(param).layer] == kept
    # the Net constructor sets the state from phase, level and stages
    net = Net(FILTER_NET, phase, level=level, stages=stages)
    assert net.layer_names == kept and net.phase == phase


def test_filter_net_include_and_exclude_is_an_error():
    param = net_param("layer { name: 'both' type: 'Input' top: 'a' include { phase: TRAIN } "
                      "exclude { phase: TEST } }")
    with pytest.raises(NetError, match="Layer 'both'.*both include and exclude"):
        FilterNet(param)


def layers_of(param):
    return [(l.name, l.type, list(l.bottom), list(l.top), list(l.loss_weight)) for l in param.layer]


def test_no_split_for_single_consumers_and_in_place():
    param = net_param("""
        layer { name: 'data' type: 'Input' top: 'data' top: 'target' }
        layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' }
        layer { name: 'relu' type: 'ReLU' bottom: 'ip' top: 'ip' }
        layer { name: 'loss' type: 'EuclideanLoss' bottom: 'ip' bottom: 'target' }""")
    assert layers_of(InsertSplits(param)) == layers_of(param)


def test_split_names_and_rewired_bottoms():
    param = net_param("""
        layer { name: 'data' type: 'Input' top: 'data' top: 'label' }
        layer { name: 'ip1' type: 'InnerProduct' bottom: 'data' top: 'ip1' }
        layer { name: 'ip2' type: 'InnerProduct' bottom: 'data' top: 'ip2' }
        layer { name: 'sum' type: 'Eltwise' bottom: 'ip1' bottom: 'ip2' bottom: 'data' top: 'sum' }
        layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'sum' bottom: 'label' }""")
    assert layers_of(InsertSplits(param)) == [
        ("data", "Input", [], ["data", "label"], []),
        ("data_data_0_split", "Split", ["data"],
         ["data_data_0_split_0", "data_data_0_split_1", "data_data_0_split_2"], []),
        ("ip1", "InnerProduct", ["data_data_0_split_0"], ["ip1"], []),
        ("ip2", "InnerProduct", ["data_data_0_split_1"], ["ip2"], []),
        ("sum", "Eltwise", ["ip1", "ip2", "data_data_0_split_2"], ["sum"], []),
        ("loss", "SoftmaxWithLoss", ["sum", "label"], [], []),
    ]


def test_split_after_in_place_uses_the_last_producer():
    # relu rewrites 'ip' in place; the two later consumers split the relu's output (layer 'relu', top 0)
    param = net_param("""
        layer { name: 'data' type: 'Input' top: 'data' }
        layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' }
        layer { name: 'relu' type: 'ReLU' bottom: 'ip' top: 'ip' }
        layer { name: 'a' type: 'ReLU' bottom: 'ip' top: 'a' }
        layer { name: 'b' type: 'ReLU' bottom: 'ip' top: 'b' }""")
    out = layers_of(InsertSplits(param))
    assert out[3] == ("ip_relu_0_split", "Split", ["ip"], ["ip_relu_0_split_0", "ip_relu_0_split_1"], [])
    assert out[4][2] == ["ip_relu_0_split_0"] and out[5][2] == ["ip_relu_0_split_1"]


def test_loss_weight_moves_to_the_split():
    # a top that is both a loss (loss_weight) and a bottom: the split carries the loss on output 0
    param = net_param("""
        layer { name: 'data' type: 'Input' top: 'data' }
        layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' loss_weight: 2.5 }
        layer { name: 'relu' type: 'ReLU' bottom: 'ip' top: 'r' }""")
    assert layers_of(InsertSplits(param)) == [
        ("data", "Input", [], ["data"], []),
        ("ip", "InnerProduct", ["data"], ["ip"], []),
        ("ip_ip_0_split", "Split", ["ip"], ["ip_ip_0_split_0", "ip_ip_0_split_1"], [2.5, 0.0]),
        ("relu", "ReLU", ["ip_ip_0_split_1"], ["r"], []),
    ]


def test_zero_loss_weight_is_not_a_consumer():
    param = net_param("""
        layer { name: 'data' type: 'Input' top: 'data' }
        layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' loss_weight: 0 }
        layer { name: 'relu' type: 'ReLU' bottom: 'ip' top: 'r' }""")
    assert layers_of(InsertSplits(param)) == layers_of(param)


def test_legacy_input_fields_split_as_layer_input():
    param = net_param("input: 'x' layer { name: 'a' type: 'ReLU' bottom: 'x' top: 'a' } "
                      "layer { name: 'b' type: 'ReLU' bottom: 'x' top: 'b' }")
    out = layers_of(InsertSplits(param))
    assert out[0] == ("x_input_0_split", "Split", ["x"], ["x_input_0_split_0", "x_input_0_split_1"], [])


def test_split_layer_shares_data_and_sums_diffs():
    import numpy as np
    from caffe.net.testing import input_layer, python_layer
    net = Net("\n".join(["force_backward: true", input_layer("in", {"x": (2, 3)}),
                         'layer { name: "a" type: "ReLU" bottom: "x" top: "a" }',
                         'layer { name: "b" type: "ReLU" bottom: "x" top: "b" }',
                         python_layer("s", "SumAll", ["a", "b"], ["s"], extra="loss_weight: 1")]), caffe.TRAIN)
    x = np.array([[1, -2, 3], [4, 5, -6]], np.float32)
    net.blobs["x"].data[...] = x
    net.ForwardBackward()
    assert net.blobs["x_in_0_split_0"].data_mem is net.blobs["x"].data_mem  # no copy of the data
    np.testing.assert_array_equal(net.blobs["x"].diff, 2.0 * (x > 0))
