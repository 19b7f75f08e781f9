"""Mutation survivors of the convolution layers (docs/MUTATION.md, layers-7): errors naming the shapes."""
import numpy as np
import pytest

from caffe.layers import LayerError
from caffe.layers.testing import make_layer, run_forward


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
def test_conv_reshape_names_the_axes_it_was_set_up_for(type_name):
    layer = make_layer(type_name, "convolution_param { num_output: 2 kernel_size: 1 }")
    bottom, top = run_forward(layer, [np.zeros((1, 2, 3, 3))])
    bottom[0].reshape((2, 3, 3))
    with pytest.raises(LayerError, match=rf"{type_name}.*\(2, 3, 3\).*set up for 4 axes"):
        layer.Reshape(bottom, top)


@pytest.mark.parametrize("dtype, channels", [(np.float64, 2), (np.float32, 2), (np.float32, 8)])
def test_deconv_bottom_diff_without_the_weight_diff(dtype, channels):
    # Deconvolution's bottom diff is a convolution forward of the top diff: with the weight diff not asked,
    # it lowers the top diff itself (float64, and float32 past the exact short-K forward: 8 * 3 * 3 > 32)
    text = (f"convolution_param {{ num_output: 3 kernel_size: 3 stride: 2 pad: 1 bias_term: false "
            f"weight_filler {{ type: 'gaussian' }} }}")
    x = np.random.default_rng(1).normal(size=(2, channels, 4, 3))
    layer = make_layer("Deconvolution", text)
    bottom, top = run_forward(layer, [x], dtype=dtype)
    diffs = []
    for weights in (True, False):
        layer.set_param_propagate_down(0, weights)
        layer.blobs[0].diff[...] = 0
        top[0].diff[...] = np.random.default_rng(2).normal(size=top[0].shape)
        layer.Backward(top, [True], bottom)
        diffs.append(bottom[0].diff.copy())
        assert np.any(layer.blobs[0].diff != 0) == weights
    np.testing.assert_array_equal(diffs[1], diffs[0])
