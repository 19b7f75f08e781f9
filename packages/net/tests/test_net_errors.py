"""Bad net definitions: each gets one clear error naming what is wrong."""
import re

import numpy as np
import pytest

import caffe
from caffe.layers import LayerError, UnknownLayerTypeError
from caffe.net import Net, NetError, ProtoFileError
from caffe.net.testing import ensure_split_layer, input_layer, python_layer

ensure_split_layer()

INPUT = input_layer("input", {"data": (2, 3)})


def test_bottom_that_no_layer_produces():
    text = INPUT + '\nlayer { name: "relu" type: "ReLU" bottom: "nothing" top: "r" }'
    with pytest.raises(NetError, match=re.escape("Unknown bottom blob 'nothing' (layer 'relu', bottom index 0): "
                                                 "no earlier layer produces it.")):
        Net(text, caffe.TEST)


def test_two_layers_writing_one_top():
    text = "\n".join([INPUT, 'layer { name: "r1" type: "ReLU" bottom: "data" top: "out" }',
                      input_layer("input2", {"data2": (2, 3)}),
                      'layer { name: "r2" type: "ReLU" bottom: "data2" top: "out" }'])
    with pytest.raises(NetError, match="Top blob 'out' produced by multiple sources: layer 'r2' .* but layer "
                                       "'r1' already produced it"):
        Net(text, caffe.TEST)


def test_in_place_on_a_blob_others_consume_explains_the_split():
    text = "\n".join([INPUT, 'layer { name: "a" type: "ReLU" bottom: "data" top: "a" }',
                      'layer { name: "inplace" type: "ReLU" bottom: "data" top: "data" }'])
    with pytest.raises(NetError, match="Top blob 'data' produced by multiple sources.*other layers consume "
                                       "'data' too, so Caffe split it"):
        Net(text, caffe.TEST)


def test_a_loop():
    text = "\n".join([INPUT, 'layer { name: "A" type: "ReLU" bottom: "b" top: "a" }',
                      'layer { name: "B" type: "ReLU" bottom: "a" top: "b" }'])
    with pytest.raises(NetError, match=re.escape("Unknown bottom blob 'b' (layer 'A', bottom index 0): no earlier "
                                                 "layer produces it; it is produced only by the later layer 'B' "
                                                 "(index 2).") + ".*cycle"):
        Net(text, caffe.TEST)
    self_loop = INPUT + '\nlayer { name: "S" type: "ReLU" bottom: "s" top: "s" }'
    with pytest.raises(NetError, match="'s' .*produced only by the layer itself"):
        Net(self_loop, caffe.TEST)


def test_prototxt_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "x"\nlayer {\n  name: "a"\n  tpye: "ReLU"\n}\n')
    with pytest.raises(ProtoFileError) as e:
        Net(str(path), caffe.TEST)
    assert e.value.path == str(path) and e.value.line == 4 and e.value.column == 3
    assert str(e.value).startswith(f"{path}:4:3: ") and "tpye" in str(e.value)
    with pytest.raises(ProtoFileError, match=r"<prototxt text>:1:\d+: .*"):
        Net('layer { name: "a" type: "ReLU" \n', caffe.TEST)  # text: unterminated message


def test_missing_net_file(tmp_path):
    missing = tmp_path / "none.prototxt"
    with pytest.raises(ProtoFileError, match=re.escape(f"Cannot open NetParameter file '{missing}': no such file")):
        Net(str(missing), caffe.TEST)


def test_unknown_layer_type_names_layer_and_close_types():
    text = INPUT + '\nlayer { name: "act" type: "Relu" bottom: "data" top: "a" }'
    with pytest.raises(UnknownLayerTypeError, match=r"^Layer 'act': Unknown layer type: 'Relu'\. Did you mean: "
                                                    r"ReLU\?"):
        Net(text, caffe.TEST)


def test_propagate_down_count():
    text = INPUT + '\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" propagate_down: true ' \
                   'propagate_down: false }'
    with pytest.raises(NetError, match="Layer 'r': propagate_down must be specified either 0 or bottom_size times"):
        Net(text, caffe.TEST)


def test_bad_phase_and_bad_network_argument():
    with pytest.raises(ValueError, match="phase must be caffe.TRAIN"):
        Net(INPUT, 5)
    with pytest.raises(TypeError, match="NetParameter, a prototxt path or prototxt text"):
        Net(42, caffe.TEST)


def test_layer_setup_errors_name_the_layer():
    text = INPUT + '\nlayer { name: "py" type: "Python" bottom: "data" top: "p" ' \
                   'python_param { module: "no_such_module_xyz" layer: "L" } }'
    with pytest.raises(LayerError, match="Layer 'py' \\(Python\\): python_param.module 'no_such_module_xyz'"):
        Net(text, caffe.TEST)
    wrong_count = INPUT + '\nlayer { name: "r" type: "ReLU" bottom: "data" top: "a" top: "b" }'
    with pytest.raises(LayerError, match="Layer 'r' \\(ReLU\\): expects exactly 1 top"):
        Net(wrong_count, caffe.TEST)


def test_forward_errors_carry_the_layer_name():
    text = "\n".join([input_layer("input", {"scores": (2, 3), "labels": (3,)}),
                      python_layer("cmp", "CountCorrect", ["scores", "labels"], ["n"])])
    net = Net(text, caffe.TEST)
    with pytest.raises(ValueError) as e:
        net.forward()
    assert any("forward pass of layer 'cmp' (Python)" in note for note in getattr(e.value, "__notes__", []))


def test_input_shape_checks_in_pycaffe_forward():
    net = Net(INPUT + '\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" }', caffe.TEST)
    with pytest.raises(ValueError, match="Input blob arguments do not match net inputs"):
        net.forward(other=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="Input 'data' is not batch sized: shape \\(5, 3\\)"):
        net.forward(data=np.zeros((5, 3)))
    with pytest.raises(ValueError, match="Input 'data' has shape \\(2, 4\\); the blob has shape \\(2, 3\\)"):
        net.forward(data=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="no layer named 'nope'"):
        net.forward(end="nope")
