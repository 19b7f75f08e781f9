"""The layer registry: lookup, suggestions for unknown types, caffe.layer_type_list."""
import pytest

import caffe
from caffe.layers import (UnknownLayerTypeError, create_layer, layer_class, layer_type_list, register_layer,
                          registry)
from caffe.layers.layer import NeuronLayer
from caffe.layers.testing import layer_param


@pytest.fixture
def scratch_type():
    name = "ZzTestOnlyScratch"
    yield name
    registry._REGISTRY.pop(name, None)  # leave the registry as we found it


def test_create_layer_by_type():
    layer = create_layer(layer_param("Sigmoid", name="s1"))
    assert type(layer) is layer_class("Sigmoid")
    assert layer.type == "Sigmoid" and layer.name == "s1"


@pytest.mark.parametrize("wrong, close", [("Relu", "ReLU"), ("SoftMax", "Softmax"), ("Sigmod", "Sigmoid"),
                                          ("SoftmaxWithLos", "SoftmaxWithLoss"), ("relu", "ReLU")])
def test_unknown_type_suggests_close_names(wrong, close):
    with pytest.raises(UnknownLayerTypeError, match=rf"Unknown layer type: '{wrong}'\. Did you mean: .*\b{close}\b"):
        create_layer(layer_param(wrong))


def test_unknown_type_lists_known_types():
    with pytest.raises(UnknownLayerTypeError) as info:
        layer_class("CompletelyDifferentThing")
    msg = str(info.value)
    assert "Did you mean" not in msg
    for t in ("ReLU", "Softmax", "EuclideanLoss", "Accuracy"):
        assert t in msg


def test_layer_type_list_is_sorted_and_complete():
    everything = caffe.layer_type_list()  # pycaffe's top-level name; imports caffe.net (RNN, LSTM) first
    types = layer_type_list()
    assert types == sorted(types)
    mine = {"ReLU", "Sigmoid", "TanH", "PReLU", "ELU", "AbsVal", "BNLL", "Power", "Exp", "Log", "Threshold",
            "Clip", "Swish", "Dropout", "Softmax", "SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss",
            "ContrastiveLoss", "MultinomialLogisticLoss", "InfogainLoss", "HingeLoss", "Accuracy"}
    assert mine <= set(types)
    assert everything == types  # whatever ran before (alone, caffe.net was not imported yet)


def test_register_sets_type_and_rejects_a_second_class(scratch_type):
    @register_layer(scratch_type)
    class Scratch(NeuronLayer):
        pass

    assert Scratch.type == scratch_type and layer_class(scratch_type) is Scratch
    assert scratch_type in layer_type_list()
    register_layer(scratch_type)(Scratch)  # the same class again is harmless (module reloads)

    with pytest.raises(ValueError, match=f"{scratch_type}.*already registered"):
        @register_layer(scratch_type)
        class Other(NeuronLayer):
            pass
