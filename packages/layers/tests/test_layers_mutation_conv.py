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
