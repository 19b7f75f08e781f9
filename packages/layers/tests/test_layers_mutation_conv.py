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


# -- layers-7, session 7: the dense plan (conv_cpu.dense_rule, dense_forward, dense_backward) --------------

_DENSE = pytest.mark.skipif(not __import__("caffe.layers.conv_cpu", fromlist=["x"])._DENSE_SUPPORTED,
                            reason="the dense plan needs the AVX2/FMA build")
_FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"


def _dense_run(type_name, text, shape, batched, calls=None):
    """top, bottom diff, parameter diffs of a Forward and a Backward (float32); batched: the generic path.
    calls: the dense kernels that ran ("fwd": the forward kernel with the filters, "data": with them
    flipped, "wgt": the weight-diff kernel)."""
    from caffe.blob import context
    from caffe.layers import conv_base, conv_cpu
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_base, "CPU_PATHS", not batched)
        if calls is not None:
            packed = conv_cpu._packed
            mp.setattr(conv_cpu, "_packed", lambda layer, w, flip: calls.append("data" if flip else "fwd")
                       or packed(layer, w, flip))
            wgt = conv_cpu._cd.backward_weight_oc
            mp.setattr(conv_cpu._cd, "backward_weight_oc", lambda *a, **kw: calls.append("wgt") or wgt(*a, **kw))
        context.set_random_seed(3)
        layer = make_layer(type_name, f"convolution_param {{ {text} {_FILL} }}")
        rng = np.random.default_rng(3)
        bottom, top = blobs_from_arrays([rng.normal(size=shape)], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        products = conv_cpu.dense_products(layer, np.float32)
        layer.Forward(bottom, top)
        top[0].diff[...] = rng.normal(size=top[0].shape)
        bottom[0].diff[...] = 7.0  # a bottom diff not written shows
        layer.Backward(top, [True], bottom)
        return products, [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]


@_DENSE
@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("text, shape", [
    ("num_output: 72 kernel_size: 3 pad: 1", (2, 4, 5, 6)),     # conv: only the bottom diff (72 outputs per group)
    ("num_output: 4 kernel_size: 3 pad: 1", (2, 72, 5, 6)),     # deconv: the same geometry
    ("num_output: 6 kernel_size: 5", (2, 4, 9, 11)),            # pad 0, 7 columns: only the forward
    ("num_output: 6 kernel_size: 3 pad: 1", (2, 4, 5, 17)),     # 17 columns: all three
])
def test_dense_plan_runs_the_dense_kernels_for_its_products_and_the_blocked_plan_for_the_rest(type_name, text,
                                                                                              shape):
    """With some products dense and others not, the dense kernels run for exactly the products dense_rule
    names (once each), the blocked plan computes the others (the forward, Deconvolution's forward-in-backward),
    and every result is the generic path's (session 7: dense_forward's fallback, dense_backward's choices)."""
    calls = []
    products, got = _dense_run(type_name, text, shape, False, calls)
    _, want = _dense_run(type_name, text, shape, True)
    assert products and sorted(calls) == sorted(products)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@_DENSE
@pytest.mark.parametrize("text, shape, products", [
    ("num_output: 8 kernel_size: 4", (1, 64, 8, 8), ("fwd",)),                    # 64 * 4 * 4 = DENSE_MAX_KD
    ("num_output: 8 kernel_h: 3 kernel_w: 5", (1, 70, 8, 8), ()),                 # 70 * 15 = 1050 > DENSE_MAX_KD
    ("num_output: 72 kernel_size: 3 pad: 1", (1, 8, 8, 8), ("data",)),            # 72 > DENSE_MAX_OG: no forward
    ("num_output: 137 kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2", (1, 8, 8, 8), ()),  # 137 * 15 > 2 * MAX_KD
    ("num_output: 250 kernel_size: 3 pad: 1", (1, 8, 8, 8), ()),                  # 250 * 9 > 2 * DENSE_MAX_KD
])
def test_dense_rule_boundaries(text, shape, products):
    from caffe.layers import conv_cpu
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    layer = make_layer("Convolution", f"convolution_param {{ {text} }}")
    layer.SetUp(blobs_from_arrays([np.zeros(shape)], np.float32), empty_tops(1, np.float32))
    assert conv_cpu.dense_products(layer, np.float32) == products
