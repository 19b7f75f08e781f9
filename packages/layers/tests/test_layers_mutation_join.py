"""Mutation survivors of Eltwise, Concat, Slice and Split (docs/MUTATION.md, layers-8 and layers-9): the
cases the property tests did not draw, on the CPU path (compiled kernels) and the generic NumPy path."""
import numpy as np
import pytest

from caffe.layers import _cpu
from caffe.layers.testing import make_layer, run_forward


@pytest.fixture(params=["cpu", "generic"])
def path(request, monkeypatch):
    if request.param == "generic":
        monkeypatch.setattr(_cpu, "elementwise", None)
    return request.param


def test_eltwise_max_ties_follow_caffe_on_both_paths(path):
    # bottom[1] wins a tie with bottom[0]; a later bottom needs to be strictly larger than the maximum so far
    layer = make_layer("Eltwise", "eltwise_param { operation: MAX }")
    xs = [np.array([1.0, 1.0, 0.0, 3.0]), np.array([1.0, 0.0, 2.0, 3.0]), np.array([1.0, 1.0, 2.0, 3.0])]
    bottom, top = run_forward(layer, xs)
    np.testing.assert_array_equal(top[0].data, [1.0, 1.0, 2.0, 3.0])
    top[0].diff[...] = 1
    layer.Backward(top, [True] * 3, bottom)
    np.testing.assert_array_equal([b.diff for b in bottom], [[0, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]])
