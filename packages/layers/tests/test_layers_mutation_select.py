"""Mutation survivors of Filter, BatchReindex, Im2col and LSTMUnit (docs/MUTATION.md, layers-4): the cases
the property tests did not draw."""
import numpy as np
import pytest

from caffe.blob import context, deferred
from caffe.layers import LayerError
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, make_layer, run_forward

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")


# -- Filter ---------------------------------------------------------------------------------------------
def test_filter_setup_shapes_the_tops_for_the_whole_batch():
    # at setup the selector may hold no data yet, so the tops get the batch's N (Caffe's first_reshape);
    # the forward then gives the selected count
    layer = make_layer("Filter")
    bottom = blobs_from_arrays([np.arange(8.0).reshape(4, 2), np.array([0.0, 1.0, 0.0, 0.0])])
    top = empty_tops(1)
    layer.SetUp(bottom, top)
    assert top[0].shape == (4, 2)
    layer.Forward(bottom, top)
    assert top[0].shape == (1, 2)
    np.testing.assert_array_equal(top[0].data, [[2.0, 3.0]])


def test_filter_checks_every_data_bottom_and_names_the_selector():
    sel = np.array([1.0, 0.0, 1.0])
    with pytest.raises(LayerError, match=r"same 0th dimension.*bottom\[1\] has shape \(4, 2\)"):
        run_forward(make_layer("Filter"), [np.zeros((3, 2)), np.zeros((4, 2)), sel], n_top=2)
    with pytest.raises(LayerError, match=r"Selector blob \(bottom\[2\]\).*\(3, 2\)"):
        run_forward(make_layer("Filter"), [np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2))], n_top=2)
    with pytest.raises(LayerError, match=r"one top per filtered bottom: 2 data bottom\(s\), 1 top\(s\)"):
        run_forward(make_layer("Filter"), [np.zeros((3, 2)), np.zeros((3, 2)), sel], n_top=1)
    layer = make_layer("Filter")
    bottom, top = run_forward(layer, [np.zeros((3, 2)), np.zeros((3, 2)), sel], n_top=2)
    with pytest.raises(LayerError, match=r"cannot backpropagate to the filter index input \(bottom\[2\]"):
        layer.Backward(top, [True, True, True], bottom)


def test_filter_and_batch_reindex_refuse_force_backward_to_their_index_input():
    layer = make_layer("Filter")
    run_forward(layer, [np.zeros((3, 2)), np.zeros((3, 1)), np.ones(3)], n_top=2)
    assert [layer.allow_force_backward(i) for i in range(3)] == [True, True, False]
    layer = make_layer("BatchReindex")
    run_forward(layer, [np.zeros((3, 2)), np.zeros(2)])
    assert [layer.allow_force_backward(i) for i in range(2)] == [True, False]
    # Caffe's names reach the layer's own methods (they were class aliases of the base's: always True)
    assert [layer.AllowForceBackward(i) for i in range(2)] == [True, False]
    bottom, top = run_forward(layer, [np.zeros((3, 2)), np.zeros(4)])
    bottom[1].reshape((5,))
    layer.Reshape(bottom, top)
    assert top[0].shape == (5, 2)


# -- BatchReindex -----------------------------------------------------------------------------------------
def test_batch_reindex_refuses_backward_to_its_indices_by_name():
    layer = make_layer("BatchReindex")
    bottom, top = run_forward(layer, [np.zeros((3, 2)), np.array([2.0, 0.0])])
    with pytest.raises(LayerError, match=r"BatchReindex.*cannot backpropagate to the index input \(bottom\[1\]\)"):
        layer.Backward(top, [True, True], bottom)


def test_batch_reindex_errors_name_the_data_bottom():
    with pytest.raises(LayerError, match=r"bottom\[0\] must have at least one axis, got shape \(\)"):
        run_forward(make_layer("BatchReindex"), [np.zeros(()), np.array([0.0])])
    with pytest.raises(LayerError, match=r"index 2.5 .*batch size 3 \(shape \(3, 2\)\)"):
        run_forward(make_layer("BatchReindex"), [np.zeros((3, 2)), np.array([0.0, 2.5])])


@pytest.mark.parametrize("bad, shown", [(3.0, "3.0"), (-1.0, "-1.0"), (0.5, "0.5")])
@pytest.mark.gpu
@needs_gpu
def test_batch_reindex_and_embed_bad_indices_on_the_device(bad, shown):
    # in GPU mode the index check stays on the device: a bad index reads row 0 until the next read of a loss
    # (here flush()) raises the layer's error, naming the first bad value
    x = np.arange(6.0).reshape(3, 2)
    context.set_mode_gpu()
    try:
        deferred.discard()
        run_forward(make_layer("BatchReindex"), [x, np.array([0.0, 2.0])])
        deferred.flush()  # 0 and n - 1 are valid
        layer = make_layer("BatchReindex")
        bottom, top = run_forward(layer, [x, np.array([2.0, bad, 1.0, bad])])
        np.testing.assert_array_equal(top[0].data, x[[2, 0, 1, 0]])
        with pytest.raises(LayerError, match=rf"BatchReindex.*index {shown} in bottom\[1\] is invalid for bottom\[0\] "
                                             r"with batch size 3 .*\(found on the device; raised at the next read"):
            deferred.flush()
        deferred.flush()  # raised once
        embed = make_layer("Embed", "embed_param { num_output: 2 input_dim: 3 bias_term: false "
                                    "weight_filler { type: 'gaussian' } }")
        run_forward(embed, [np.array([[1.0, 0.0], [2.0, bad]])])  # any shape: the first bad value is named
        with pytest.raises(LayerError, match=rf"Embed.*{shown}.*found on the device"):
            deferred.flush()
    finally:
        deferred.discard()
        context.set_mode_cpu()


# -- Im2col -----------------------------------------------------------------------------------------------
def test_im2col_errors_name_the_shapes():
    layer = make_layer("Im2col", "convolution_param { kernel_size: 2 }")
    bottom, top = run_forward(layer, [np.zeros((1, 2, 3, 3))])
    bottom[0].reshape((2, 3, 3))
    with pytest.raises(LayerError, match=r"Im2col.*bottom\[0\] has shape \(2, 3, 3\), the layer was set up "
                                         r"for 4 axes"):
        layer.reshape(bottom, top)
    with pytest.raises(LayerError, match=r"kernel extent 3 .*exceeds the padded input size 2 \+ 2\*0 on "
                                         r"spatial axis 0 of bottom shape \(1, 1, 2, 2\)"):
        run_forward(make_layer("Im2col", "convolution_param { kernel_size: 3 }"), [np.zeros((1, 1, 2, 2))])


# -- LSTMUnit ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_place_top", [0, 1])
def test_lstm_unit_in_place_c_prev_matches_out_of_place(in_place_top):
    # c_prev may be overwritten by either top: its value is kept for backward (Caffe's gradients)
    rng = np.random.default_rng(3)
    n, d = 3, 2
    arrays = [rng.normal(size=(1, n, d)), rng.normal(size=(1, n, 4 * d)), np.array([[1.0, 0.0, 1.0]])]
    diffs = [rng.normal(size=(1, n, d)), rng.normal(size=(1, n, d))]
    ref = make_layer("LSTMUnit")
    rb, rt = run_forward(ref, arrays, n_top=2)
    for t, g in zip(rt, diffs):
        t.diff[...] = g
    ref.Backward(rt, [True, True, False], rb)

    layer = make_layer("LSTMUnit")
    bottom = blobs_from_arrays(arrays)
    top = empty_tops(2)
    top[in_place_top] = bottom[0]
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    for k in range(2):
        np.testing.assert_array_equal(top[k].data, rt[k].data)
    for t, g in zip(top, diffs):
        t.diff[...] = g
    layer.Backward(top, [True, True, False], bottom)
    np.testing.assert_allclose(bottom[1].diff, rb[1].diff, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, rb[0].diff, rtol=1e-12)
    with pytest.raises(LayerError, match=r"LSTMUnit.*Cannot backpropagate to sequence indicators \(bottom\[2\]"):
        layer.Backward(top, [True, True, True], bottom)


def test_lstm_unit_errors_name_the_bottom_and_n():
    cont = np.zeros((1, 2))
    with pytest.raises(LayerError, match=r"bottom\[0\] \(c_prev\) must have shape \(1, N, ...\) with 3 axes and "
                                         r"N = 2 from bottom\[0\]; shapes: c_prev \(1, 2\)"):
        run_forward(make_layer("LSTMUnit"), [np.zeros((1, 2)), np.zeros((1, 2, 8)), cont], n_top=2)
    with pytest.raises(LayerError, match=r"bottom\[0\] \(c_prev\) .* N = -1 from bottom\[0\]; shapes: c_prev \(2,\)"):
        run_forward(make_layer("LSTMUnit"), [np.zeros(2), np.zeros((1, 2, 8)), cont], n_top=2)
    with pytest.raises(LayerError, match=r"bottom\[1\] \(x \(gates\)\) must have shape \(1, N, ...\) with 3 axes"):
        run_forward(make_layer("LSTMUnit"), [np.zeros((1, 2, 2)), np.zeros((1, 3, 8)), cont], n_top=2)
    with pytest.raises(LayerError, match=r"bottom\[2\] \(cont\) must have shape \(1, N\) with 2 axes"):
        run_forward(make_layer("LSTMUnit"), [np.zeros((1, 2, 2)), np.zeros((1, 2, 8)), np.zeros((1, 2, 1))], n_top=2)
    layer = make_layer("LSTMUnit")
    bottom = blobs_from_arrays([np.zeros((1, 2, 2)), np.zeros((1, 2, 8)), cont])
    top = empty_tops(2)
    layer.SetUp(bottom, top)
    with pytest.raises(LayerError, match=r"backward needs a forward pass first \(no saved gate activations\)"):
        layer.Backward(top, [True, True, False], bottom)
