"""Mutation survivors of Eltwise, Concat, Slice and Split (docs/MUTATION.md, layers-8 and layers-9): the
cases the property tests did not draw, on the CPU path (compiled kernels) and the generic NumPy path."""
import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import LayerError, _cpu
from caffe.layers.testing import blobs_from_arrays, gpu_available, make_layer, run_forward

GPU = pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy "
                                                                     "with a CUDA device) available")])


@pytest.fixture(params=["cpu", "generic", GPU])
def path(request, monkeypatch):
    if request.param == "generic":
        monkeypatch.setattr(_cpu, "elementwise", None)
    if request.param == "gpu":
        context.set_mode_gpu()
        yield request.param
        context.set_mode_cpu()
        return
    yield request.param


def test_eltwise_max_ties_follow_caffe_on_both_paths(path):
    # bottom[1] wins a tie with bottom[0]; a later bottom needs to be strictly larger than the maximum so far
    layer = make_layer("Eltwise", "eltwise_param { operation: MAX }")
    xs = [np.array([1.0, 1.0, 0.0, 3.0]), np.array([1.0, 0.0, 2.0, 3.0]), np.array([1.0, 1.0, 2.0, 3.0])]
    bottom, top = run_forward(layer, xs)
    np.testing.assert_array_equal(top[0].data, [1.0, 1.0, 2.0, 3.0])
    top[0].diff[...] = 1
    layer.Backward(top, [True] * 3, bottom)
    np.testing.assert_array_equal([b.diff for b in bottom], [[0, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]])


X = np.arange(24.0).reshape(2, 3, 4)
CASES = [("Concat", "concat_param { axis: 1 }", [X, X[:, :2]], 1),
         ("Slice", "slice_param { axis: 2 slice_point: 1 }", [X], 2),
         ("Split", "", [X], 3),
         ("Eltwise", "eltwise_param { operation: MAX }", [X, X[::-1]], 1),
         ("Eltwise", "eltwise_param { operation: PROD }", [X, X[::-1]], 1)]


@pytest.mark.parametrize("type_name, text, xs, n_top", CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)])
def test_backward_writes_only_the_diffs_asked_for(type_name, text, xs, n_top, path):
    layer = make_layer(type_name, text)
    bottom, top = run_forward(layer, xs, n_top=n_top)
    for t in top:
        t.diff[...] = 1
    for k in range(len(bottom)):
        for b in bottom:
            b.diff[...] = 7
        down = [i == k for i in range(len(bottom))] if len(bottom) > 1 else [False]
        layer.Backward(top, down, bottom)
        for i, b in enumerate(bottom):
            assert np.all(b.diff == 7) != down[i], (type_name, k, i)


def test_concat_and_slice_of_three_pieces(path):
    # the third piece's offset is the sum of the first two sizes
    xs = [X[:, :1], X[:, 1:2], X]
    layer = make_layer("Concat", "concat_param { axis: 1 }")
    bottom, top = run_forward(layer, xs)
    np.testing.assert_array_equal(top[0].data, np.concatenate(xs, axis=1))
    top[0].diff[...] = np.arange(top[0].count()).reshape(top[0].shape)
    layer.Backward(top, [True] * 3, bottom)
    np.testing.assert_array_equal(np.concatenate([b.diff for b in bottom], axis=1), top[0].diff)
    layer = make_layer("Slice", "slice_param { axis: 1 slice_point: 1 slice_point: 2 }")
    bottom, top = run_forward(layer, [X], n_top=3)
    for t, want in zip(top, (X[:, :1], X[:, 1:2], X[:, 2:])):
        np.testing.assert_array_equal(t.data, want)
        t.diff[...] = -t.data
    layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, -X)


def test_split_in_place_only_on_top_0():
    layer = make_layer("Split")
    bottom = blobs_from_arrays([X])
    top = [bottom[0], Blob(dtype=np.float64)]
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    np.testing.assert_array_equal(top[1].data, X)
    with pytest.raises(LayerError, match=r"Split layer does not allow in-place computation \(top\[1\] is the bottom\)"):
        make_layer("Split").SetUp(bottom, [Blob(dtype=np.float64), bottom[0]])


@pytest.mark.parametrize("type_name, text, xs, n_top, message", [
    ("Slice", "slice_param { axis: 1 slice_dim: 1 }", [X], 2,
     r"Either slice_param.axis or slice_param.slice_dim should be specified; not both"),
    ("Slice", "slice_param { axis: 3 }", [X], 2, r"slice_param.axis 3 is out of range for bottom\[0\] with shape \(2, 3, 4\)"),
    ("Slice", "slice_param { slice_dim: 3 }", [X], 2, r"slice_param.slice_dim 3 is out of range"),
    ("Slice", "slice_param { axis: 2 slice_point: 1 }", [X], 3, r"slice_point has 1 entries for 3 tops \(needs 2\)"),
    ("Slice", "slice_param { axis: 2 slice_point: 2 slice_point: 2 }", [X], 3,
     r"slice_point \[2, 2\] must be strictly increasing and positive"),
    ("Slice", "slice_param { axis: 2 slice_point: 0 }", [X], 2, r"slice_point \[0\] must be strictly increasing"),
    ("Slice", "slice_param { axis: 2 slice_point: 4 }", [X], 2, r"slice_point \[4\] out of range for axis 2 of size 4"),
    ("Slice", "slice_param { axis: 1 }", [X], 2, r"Number of top blobs \(2\) should evenly divide input slice axis 1 of size 3"),
    ("Concat", "concat_param { axis: 1 concat_dim: 1 }", [X, X], 1,
     r"Either concat_param.axis or concat_param.concat_dim should be specified; not both"),
    ("Concat", "concat_param { axis: -4 }", [X, X], 1, r"concat_param.axis -4 is out of range for bottom\[0\] with shape \(2, 3, 4\)"),
    ("Concat", "concat_param { concat_dim: 3 }", [X, X], 1, r"concat_param.concat_dim 3 is out of range"),
    ("Concat", "concat_param { axis: 1 }", [X, X[:, :, :2]], 1,
     r"same shape, except at concat axis 1: bottom\[0\] has shape \(2, 3, 4\), bottom\[1\] has shape \(2, 3, 2\)"),
])
def test_concat_and_slice_errors_name_the_parameter(type_name, text, xs, n_top, message):
    with pytest.raises(LayerError, match=rf"{type_name}.*{message}"):
        run_forward(make_layer(type_name, text), xs, n_top=n_top)


def test_eltwise_prod_gradient_at_a_zero_is_the_product_of_the_others(path):
    # stable_prod_grad (the default) multiplies the other bottoms: no 0 / 0 where a bottom is 0
    xs = [np.array([0.0, 2.0, 0.0]), np.array([3.0, 0.0, 0.0]), np.array([2.0, 5.0, 4.0])]
    layer = make_layer("Eltwise", "eltwise_param { operation: PROD }")
    bottom, top = run_forward(layer, xs)
    top[0].diff[...] = 1
    layer.Backward(top, [True] * 3, bottom)
    np.testing.assert_array_equal([b.diff for b in bottom], [[6.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 0.0]])
