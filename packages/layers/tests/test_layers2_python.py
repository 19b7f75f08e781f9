"""The Python layer type: python_param module/layer/param_str, phase, own blobs, gradient, errors."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import LayerError
from caffe.layers.strategies import random_array, seeds, shapes
from caffe.layers.testing import check_layer_gradient, make_layer, run_forward

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the helper module layers2_pylayers

TRAIN, TEST = 0, 1


def py(layer, param_str="", phase=TRAIN):
    text = f"python_param {{ module: 'layers2_pylayers' layer: '{layer}' param_str: '{param_str}' }}"
    return make_layer("Python", text, phase=phase)


@given(shape=shapes(1, 3, 1, 3), seed=seeds(), w=st.sampled_from([0.5, -2.0, 3.0]))
def test_python_layer_gradient_and_param_str(shape, seed, w):
    x = random_array(seed, shape)
    layer = py("ScaledSum", str(w))
    bottom, top = check_layer_gradient(layer, [x])
    layer.Forward(bottom, top)
    np.testing.assert_allclose(top[0].data, w * x)
    assert len(layer.blobs) == 1 and layer.blobs[0].data[0] == w  # its own blob, via add_blob


def test_python_layer_sees_param_str_and_phase_in_setup():
    for phase in (TRAIN, TEST):
        layer = py("ScaledSum", "2.5", phase)
        run_forward(layer, [np.ones(3)])
        assert layer.impl.seen_param_str == "2.5" and layer.impl.seen_phase == phase
    layer = py("WithInit", "hello")
    _, top = run_forward(layer, [np.arange(3.0)])
    assert layer.impl.param_str_at_init == "hello"
    np.testing.assert_array_equal(top[0].data, np.arange(3.0))


def test_python_layer_blobs_round_trip():
    layer = py("ScaledSum", "4")
    run_forward(layer, [np.ones(2)])
    from caffe.layers import create_layer
    again = create_layer(layer.to_proto())
    _, top = run_forward(again, [np.ones(2)])
    assert len(again.blobs) == 1  # the stored blob is reused, setup adds none
    np.testing.assert_allclose(top[0].data, 4)


def test_python_layer_errors():
    with pytest.raises(LayerError, match=r"Layer 'test' \(Python\).*python_param.module 'no_such_module_l2'"):
        make_layer("Python", "python_param { module: 'no_such_module_l2' layer: 'X' }")
    with pytest.raises(LayerError, match=r"python_param.layer 'Missing' not found in module 'layers2_pylayers'"):
        py("Missing")
    with pytest.raises(LayerError, match=r"needs both 'module' and 'layer'"):
        make_layer("Python", "python_param { module: 'layers2_pylayers' }")
