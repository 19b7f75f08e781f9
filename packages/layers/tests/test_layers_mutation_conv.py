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
    ("num_output: 6 kernel_size: 5 pad_w: 1", (2, 4, 9, 11)),   # not "same", 9 columns: only the forward
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
    ("num_output: 8 kernel_size: 4 pad: 1", (1, 64, 8, 8), ("fwd",)),             # 64 * 4 * 4 = DENSE_MAX_KD
    ("num_output: 8 kernel_size: 3", (1, 8, 8, 8), ()),                           # unpadded: blocked (LeNet)
    ("num_output: 8 kernel_size: 3 pad_w: 1", (1, 8, 8, 8), ("fwd",)),            # padded on one axis
    ("num_output: 8 kernel_h: 3 kernel_w: 5 pad: 1", (1, 70, 8, 8), ()),          # 70 * 15 = 1050 > DENSE_MAX_KD
    ("num_output: 72 kernel_size: 3 pad: 1", (1, 8, 8, 8), ("data",)),            # 72 > DENSE_MAX_OG: no forward
    ("num_output: 137 kernel_h: 3 kernel_w: 5 pad_h: 1 pad_w: 2", (1, 8, 8, 8), ()),  # 137 * 15 > 2 * MAX_KD
    ("num_output: 250 kernel_size: 3 pad: 1", (1, 8, 8, 8), ()),                  # 250 * 9 > 2 * DENSE_MAX_KD
    ("num_output: 8 kernel_h: 3 kernel_w: 5 pad: 1", (1, 8, 8, 8), ("fwd",)),   # "same" on one axis only
])
def test_dense_rule_boundaries(text, shape, products, monkeypatch):
    """The AVX2 rule's edges, NumPy's OpenBLAS on AVX2 kernels (BLAS512 off)."""
    from caffe.layers import conv_cpu
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    monkeypatch.setattr(conv_cpu, "BLAS512", False)
    layer = make_layer("Convolution", f"convolution_param {{ {text} }}")
    layer.SetUp(blobs_from_arrays([np.zeros(shape)], np.float32), empty_tops(1, np.float32))
    assert conv_cpu.dense_products(layer, np.float32) == products


@_DENSE
@pytest.mark.parametrize("text, shape, products", [
    ("num_output: 64 kernel_size: 3 pad: 1", (1, 8, 10, 10), ("fwd", "wgt", "data")),   # 64 = WGT_MAX_OG
    ("num_output: 65 kernel_size: 3 pad: 1", (1, 8, 10, 10), ("fwd", "data")),          # past it: weight diff blocked
    ("num_output: 8 kernel_size: 3 pad: 1", (1, 192, 10, 10), ("fwd", "wgt", "data")),   # 192 = DATA_MAX_CG
    ("num_output: 8 kernel_size: 3 pad: 1", (1, 193, 10, 10), ("fwd", "wgt")),           # past it: bottom diff blocked
    ("num_output: 129 kernel_size: 3 pad: 1", (1, 8, 9, 11), ("data",)),  # 99 positions: the AVX2 rule (129 > 64)
    ("num_output: 8 kernel_size: 3", (1, 8, 10, 10), ()),                                # unpadded: blocked
    # batch 1: blocked from 64 outputs a group (B1_MIN_OG) on planes of 784 positions (B1_MIN_PLANE)
    ("num_output: 64 kernel_size: 3 pad: 1", (1, 8, 28, 28), ()),
    ("num_output: 63 kernel_size: 3 pad: 1", (1, 8, 28, 28), ("fwd", "wgt", "data")),
    ("num_output: 64 kernel_size: 3 pad: 1", (1, 8, 27, 29), ("fwd", "wgt", "data")),   # 783 positions
    ("num_output: 64 kernel_size: 3 pad: 1", (2, 8, 28, 28), ("fwd", "wgt", "data")),   # batch 2
    ("num_output: 128 kernel_size: 3 pad: 1 group: 2", (1, 8, 28, 28), ()),            # 64 a group
    ("num_output: 126 kernel_size: 3 pad: 1 group: 2", (1, 8, 28, 28), ("fwd", "wgt", "data")),  # 63 a group
])
def test_dense_rule_boundaries_blas512(text, shape, products, monkeypatch):
    """The rules where NumPy's OpenBLAS runs AVX-512 kernels (BLAS512), on the AVX-512 kernels' wide planes
    (DENSE512_MIN_PLANE = 100 positions) and below them."""
    from caffe.layers import conv_cpu
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    monkeypatch.setattr(conv_cpu, "BLAS512", True)
    monkeypatch.setattr(conv_cpu._cd, "AVX512", True)
    layer = make_layer("Convolution", f"convolution_param {{ {text} }}")
    layer.SetUp(blobs_from_arrays([np.zeros(shape)], np.float32), empty_tops(1, np.float32))
    assert conv_cpu.dense_products(layer, np.float32) == products


# -- layers-7, session 8: conv_base.conv_backward on the batched (GPU) path ----------------------------

@pytest.mark.parametrize("cpu_paths", [True, False])
def test_conv_backward_with_only_the_bias_diff_asked(cpu_paths, monkeypatch):
    """param_propagate_down (False, True), no bottom diff: the bias diff alone (+= the top diff's sums), on
    the CPU plans and the batched path (session 8: conv_backward's `bias_diff is None` lowered no rows)."""
    from caffe.layers import conv_base
    monkeypatch.setattr(conv_base, "CPU_PATHS", cpu_paths)
    layer = make_layer("Convolution", f"convolution_param {{ num_output: 3 kernel_size: 2 {_FILL} }}")
    bottom, top = run_forward(layer, [np.random.default_rng(4).normal(size=(2, 2, 4, 3))])
    top[0].diff[...] = dy = np.random.default_rng(5).normal(size=top[0].shape)
    for b in bottom + layer.blobs:
        b.diff[...] = 7.0
    layer.set_param_propagate_down(0, False)
    layer.set_param_propagate_down(1, True)
    layer.Backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[1].diff, 7.0 + dy.sum(axis=(0, 2, 3)), rtol=1e-12)
    assert (layer.blobs[0].diff == 7.0).all() and (bottom[0].diff == 7.0).all()


@pytest.mark.parametrize("forward_cpu", [True, False])
@pytest.mark.parametrize("limit, chunk", [(64, 1), (200, 2)])
def test_conv_backward_after_the_plan_changed_lowers_again(forward_cpu, limit, chunk, monkeypatch):
    """CPU_PATHS switched between Forward and Backward (the benchmarks' switch): the column block the
    forward's plan kept is not the other plan's (here the batched path works in chunks of one or two of
    the three images, the blocked plan's one block holds all), so the backward lowers again; the diffs are
    the batched path's alone (session 8: conv_backward's `kept_plan == plan` used the other plan's block;
    reshape's chunk of 2.0 images, from `/` for `*` or `//`, and the batched forward keeping its last
    chunk's columns for every chunk)."""
    from caffe.layers import conv_base
    monkeypatch.setattr(conv_base, "COL_BUFFER_LIMIT", limit)  # 96 column-buffer elements an image
    x = np.random.default_rng(6).normal(size=(3, 2, 5, 4))
    dy = None
    diffs = []
    for switch in (True, False):
        context_seed(8)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 3 kernel_size: 2 {_FILL} }}")
        monkeypatch.setattr(conv_base, "CPU_PATHS", forward_cpu if switch else False)
        bottom, top = run_forward(layer, [x])
        assert type(layer.chunk) is int and layer.chunk == chunk
        if dy is None:
            dy = np.random.default_rng(7).normal(size=top[0].shape)
        top[0].diff[...] = dy
        monkeypatch.setattr(conv_base, "CPU_PATHS", not forward_cpu if switch else False)
        layer.Backward(top, [True], bottom)
        diffs.append([bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs])
    for got, want in zip(*diffs):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def context_seed(seed):
    from caffe.blob import context
    context.set_random_seed(seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", ["kernel_size: 1", "kernel_size: 3 pad: 1"])
def test_conv_with_two_bottoms_keeps_each_bottoms_own_columns(dtype, kernel, monkeypatch):
    """Column blocks lowered into the shared scratch buffers (a 1x1 layer's images copied side by side, the
    batched path's unkept chunks) are overwritten by the next bottom's forward: only a layer's own kept
    buffer is kept for the backward; each pair's weight diff is its own bottom's, on the CPU plans and the
    batched (GPU) path alike (session 8: blocked_forward returning the shared buffer as the kept block,
    conv_forward lowering the kept chunk into the shared one)."""
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(*_two_bottom_grads(monkeypatch, kernel, (3, 4, 2, 3), 9, dtype)):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _two_bottom_grads(monkeypatch, kernel, shape, seed, dtype, check=None):
    """A 5-output Convolution with two bottom/top pairs, forward + backward on the CPU plans and on the
    batched (GPU) path: [bottom diffs + param diffs] per path. check(layer) runs after the CPU forward."""
    from caffe.layers import conv_base
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=shape) for _ in range(2)]
    dys = [rng.normal(size=(shape[0], 5) + shape[2:]) for _ in range(2)]
    got = []
    for cpu_paths in (True, False):
        monkeypatch.setattr(conv_base, "CPU_PATHS", cpu_paths)
        context_seed(seed + 1)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 5 {kernel} {_FILL} }}")
        bottom, top = run_forward(layer, xs, n_top=2, dtype=dtype)
        if cpu_paths and check is not None:
            check(layer)
        for t, d in zip(top, dys):
            t.diff[...] = d
        layer.Backward(top, [True, True], bottom)
        got.append([b.diff.copy() for b in bottom + layer.blobs])
    return got


@pytest.mark.parametrize("cpu_paths", [True, False])
def test_two_conv_layers_keep_their_own_columns(cpu_paths, monkeypatch):
    """The column block a layer keeps from Forward for Backward is its own (the scratch buffers shared by
    every layer are not): a second layer of the same geometry run in between leaves the first layer's
    diffs as they are alone (session 8: BaseConvolutionLayer.buffer storing kept blocks in the shared
    workspace)."""
    from caffe.layers import conv_base
    monkeypatch.setattr(conv_base, "CPU_PATHS", cpu_paths)
    rng = np.random.default_rng(11)
    xa, xb = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 5, 4))
    dya, dyb = rng.normal(size=(2, 4, 5, 4)), rng.normal(size=(2, 4, 5, 4))

    def layer_run(x, seed):
        context_seed(seed)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 {_FILL} }}")
        bottom, top = run_forward(layer, [x])
        return layer, bottom, top

    def backward(run, dy):
        layer, bottom, top = run
        top[0].diff[...] = dy
        layer.Backward(top, [True], bottom)
        return [bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]

    alone = backward(layer_run(xa, 12), dya)
    a = layer_run(xa, 12)
    b = layer_run(xb, 13)
    backward(b, dyb)
    for got, want in zip(backward(a, dya), alone):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_float32_forward_of_exactly_exact_forward_max_k_terms_is_correctly_rounded():
    """The exact short-K forward's boundary: kernel_dim == EXACT_FORWARD_MAX_K (2 channels x 4 x 4 = 32) is
    still taken in float64 and rounded once (session 8: `<` for `<=` in exact_forward)."""
    from caffe.blob import context
    from caffe.layers import conv_base
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    x = np.random.default_rng(14).normal(size=(2, 2, 7, 6)).astype(np.float32)
    outs = []
    for dtype in (np.float32, np.float64):
        context.set_random_seed(15)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 3 kernel_size: 4 {_FILL} }}")
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        assert layer.kernel_dim == conv_base.EXACT_FORWARD_MAX_K
        for b in layer.blobs:
            b.data[...] = b.data.astype(np.float32)
        layer.Forward(bottom, top)
        outs.append(top[0].data.copy())
    np.testing.assert_array_equal(outs[0], outs[1].astype(np.float32))


# -- layers-15, session 9: the forward epilogue (conv_base.apply_epilogue, conv_cpu's stores) and the exact
# GEMM kernel's callers ------------------------------------------------------------------------------------

def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


_EDGES = [np.nan, -0.0, 0.0, -1.0, 2.0, -np.inf, np.inf, 0.75, -0.5, 1e-40, -3e-39]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act, layer_text", [
    ((1, 0.0, 0.0), ("ReLU", "")),
    ((1, 0.25, 0.0), ("ReLU", "relu_param { negative_slope: 0.25 }")),
    ((1, -0.5, 0.0), ("ReLU", "relu_param { negative_slope: -0.5 }")),
    ((2, -0.5, 0.75), ("Clip", "clip_param { min: -0.5 max: 0.75 }")),
    ((2, 0.0, 1.0), ("Clip", "clip_param { min: 0 max: 1 }")),
])
def test_apply_epilogue_is_the_cpu_layers_activation_bit_for_bit(act, layer_text, dtype):
    """On the host, apply_epilogue (the batched plan's epilogue, a folded InnerProduct's activation) gives
    the bits the CPU ReLU / Clip layer gives, NaN, signed zeros, infinities and subnormals included: a
    folded net is the unfolded one (session 9: NaN stays NaN, as Caffe's ReLU and Clip keep it; `a == 1`
    for `a == 0`, -0 for +0; `>=` for `>`, -0 for +0 at -0 with a negative slope)."""
    from caffe.layers import conv_base
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    x = np.array(_EDGES, dtype)
    layer = make_layer(*layer_text)
    bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    out = x.copy()
    conv_base.apply_epilogue(np, out, act)
    np.testing.assert_array_equal(_bits(out), _bits(top[0].data))


def _fused_and_unfused(x, conv_text, seed, dtype, act, act_layer=None, check=None):
    """The Convolution with `act` as its epilogue, then without it followed by the act_layer (type, text) in
    place (None: no layer after it), the same seed: (the last layer, [fused top, unfused top], the unfused
    Convolution's own top). check(layer) runs after each SetUp."""
    from caffe.blob import context
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    outs, raw = [], None
    for fused in (True, False):
        context.set_random_seed(seed)
        layer = make_layer("Convolution", conv_text)
        bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
        layer.SetUp(bottom, top)
        if check is not None:
            check(layer)
        layer.epilogue = act if fused else None
        layer.Forward(bottom, top)
        if not fused:
            raw = top[0].data.copy()
            if act_layer is not None:
                a = make_layer(*act_layer)
                a.SetUp(top, top)
                a.Forward(top, top)
        outs.append(top[0].data.copy())
    return layer, outs, raw


@pytest.mark.parametrize("cpu_paths", [True, False])
def test_conv_epilogue_on_nan_inputs_is_the_unfolded_relu(cpu_paths, monkeypatch):
    """A Convolution with a ReLU epilogue (inference folding) == the Convolution, then the ReLU layer, bit for
    bit, with a NaN in the bottom: on the CPU plans and the batched plan (N-d, force_nd_im2col) alike
    (session 9: the batched plan's epilogue and the CPU ReLU kernel disagreed on NaN; both now keep it, as
    Caffe's ReLU does)."""
    from caffe.layers import conv_base
    monkeypatch.setattr(conv_base, "CPU_PATHS", cpu_paths)
    x = np.random.default_rng(16).normal(size=(2, 3, 5, 4)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    layer, outs, _ = _fused_and_unfused(x, f"convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 {_FILL} }}",
                                        17, np.float32, (conv_base.ACT_RELU, 0.0, 0.0), ("ReLU", ""))
    assert layer.plan(np, np.float32) == ("blocked" if cpu_paths else "batched")
    assert np.isnan(x).any() and np.isnan(outs[1]).any() and not np.isnan(outs[1]).all()  # NaN passed on
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))


@_DENSE
def test_dense_plan_epilogue_when_the_forward_goes_blocked():
    """A dense-plan layer whose forward is not dense (72 outputs per group: only the bottom diff is) runs the
    blocked forward, with the epilogue (session 9: dense_forward's fallback dropped `act`)."""
    from caffe.layers import conv_base, conv_cpu

    def dense_for_data_only(layer):
        assert layer.plan(np, np.float32) == "dense" and conv_cpu.dense_products(layer, np.float32) == ("data",)

    x = np.random.default_rng(18).normal(size=(2, 4, 5, 6)).astype(np.float32)
    _, outs, _ = _fused_and_unfused(x, f"convolution_param {{ num_output: 72 kernel_size: 3 pad: 1 {_FILL} }}",
                                    19, np.float32, (conv_base.ACT_CLIP, -0.25, 0.5), check=dense_for_data_only)
    assert (outs[1] < -0.25).any() and (outs[1] > 0.5).any()
    np.testing.assert_array_equal(outs[0], np.clip(outs[1], np.float32(-0.25), np.float32(0.5)))


@pytest.mark.skipif(not __import__("caffe.layers.conv_cpu", fromlist=["x"]).EXACT_GEMM,
                    reason="kernels.exact_gemm is not vectorized on this CPU")
def test_exact_kernel_forward_with_two_bottoms_keeps_each_bottoms_own_block(monkeypatch):
    """The exact GEMM kernel's forward (float32, kernel_dim <= EXACT_FORWARD_MAX_K, one block) keeps each
    bottom's float32 column block in the layer's own buffer: the second bottom's forward does not overwrite
    the first's, so each pair's weight diff is its own bottom's, as the batched path computes it (session 9:
    _exact_forward lowering the kept block into the shared scratch buffer)."""
    def one_exact_block(layer):
        blocks = layer.cpu_blocks(2, np.float32, exact=True)
        assert blocks.kernel and len(blocks.blocks) == 1

    got = _two_bottom_grads(monkeypatch, "kernel_size: 3 pad: 1", (2, 3, 4, 5), 20, np.float32, one_exact_block)
    for g, w in zip(*got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias_term", [True, False])
@pytest.mark.parametrize("act, layer_text", [
    ((1, 0.0, 0.0), ("ReLU", "")),
    ((1, 0.25, 0.0), ("ReLU", "relu_param { negative_slope: 0.25 }")),
    ((2, -0.5, 0.75), ("Clip", "clip_param { min: -0.5 max: 0.75 }")),
])
def test_blocked_plan_epilogue_with_one_image_a_block(act, layer_text, bias_term, dtype):
    """The blocked plan's GEMM written straight into the blob (one image a block, no float64 exact block:
    36 terms; stride 2: not the dense plan) applies the epilogue in its bias pass, with and without a bias: the layer, then the ReLU / Clip
    layer, bit for bit (session 9: _gemm_out skipping the pass without a bias, or misplacing its arguments)."""
    def one_image_a_block(layer):
        blocks = layer.cpu_blocks(1, dtype, exact=False)
        assert layer.plan(np, dtype) == "blocked" and not layer.exact_forward(dtype) and len(blocks.blocks) == 1

    x = np.random.default_rng(22).normal(size=(1, 4, 7, 6))
    text = f"convolution_param {{ num_output: 3 kernel_size: 3 pad: 1 stride: 2 bias_term: {str(bias_term).lower()} {_FILL} }}"
    _, outs, raw = _fused_and_unfused(x, text, 23, dtype, act, layer_text, check=one_image_a_block)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    assert (raw != outs[1]).any()  # the activation changed something on this draw


@pytest.mark.skipif(not __import__("caffe.layers.conv_cpu", fromlist=["x"]).EXACT_GEMM,
                    reason="kernels.exact_gemm is not vectorized on this CPU")
def test_forward_drops_the_block_kept_by_an_earlier_forward(monkeypatch):
    """A Forward that keeps no column block drops the one an earlier Forward kept: the exact GEMM kernel keeps
    its float32 block, the float64 path (EXACT_GEMM off, as the benchmarks switch it) keeps none, and the
    Backward after it must not take the first Forward's block of another bottom (session 9: conv_forward's
    `_kept_col.pop(key)` with another key)."""
    from caffe.layers import conv_cpu
    rng = np.random.default_rng(24)
    x1, x2 = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 3, 4, 5))
    dy = rng.normal(size=(2, 4, 4, 5))
    diffs = []
    for first in (x1, None):
        monkeypatch.setattr(conv_cpu, "EXACT_GEMM", True)
        context_seed(25)
        layer = make_layer("Convolution", f"convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 {_FILL} }}")
        bottom, top = run_forward(layer, [x1 if first is not None else x2], dtype=np.float32)
        if first is not None:  # kept the float32 block of x1; now x2 by the float64 path
            assert layer._kept_col
            monkeypatch.setattr(conv_cpu, "EXACT_GEMM", False)
            bottom[0].data[...] = x2
            layer.Forward(bottom, top)
        top[0].diff[...] = dy
        layer.Backward(top, [False], bottom)
        diffs.append(layer.blobs[0].diff.copy())
    np.testing.assert_allclose(diffs[0], diffs[1], rtol=1e-6, atol=1e-6)


def test_conv_setup_errors_name_the_bias():
    """A given bias blob of the wrong shape, and a bad bias filler, are errors of this layer naming the bias
    (session 9: layer_setup's bias messages)."""
    from caffe.layers.registry import create_layer
    from caffe.layers.testing import layer_param
    src = make_layer("Convolution", f"convolution_param {{ num_output: 2 kernel_size: 2 {_FILL} }}")
    run_forward(src, [np.ones((1, 3, 4, 4))])
    param = src.to_proto()
    param.blobs[1].shape.dim[:] = [3]
    param.blobs[1].data.append(0.0)
    bad = layer_param("Convolution", "convolution_param { num_output: 2 kernel_size: 2 }", name="c")
    bad.blobs.extend(param.blobs)
    with pytest.raises(LayerError, match=r"Layer 'c' \(Convolution\).*Incorrect bias shape: expected shape "
                                         r"\(2,\); instead, shape was \(3,\)"):
        run_forward(create_layer(bad), [np.ones((1, 3, 4, 4))])
    filler = make_layer("Convolution", "convolution_param { num_output: 2 kernel_size: 2 "
                                       "bias_filler { type: 'gausian' } }", name="c")
    with pytest.raises(LayerError, match=r"Layer 'c' \(Convolution\).*convolution_param\.bias_filler: .*gausian"):
        run_forward(filler, [np.ones((1, 3, 4, 4))])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("caffe.layers.testing", fromlist=["x"]).gpu_available(),
                    reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")
@pytest.mark.parametrize("act, layer_text", [
    ((1, 0.0, 0.0), ("ReLU", "")),
    ((1, 0.25, 0.0), ("ReLU", "relu_param { negative_slope: 0.25 }")),
    ((2, -0.5, 0.75), ("Clip", "clip_param { min: -0.5 max: 0.75 }")),
])
def test_apply_epilogue_on_the_device_is_the_gpu_layers_activation(act, layer_text):
    """On a device, apply_epilogue gives what the ReLU / Clip layer gives in GPU mode: max(x, 0) for slope 0,
    NaN staying NaN (session 9: the device branch of apply_epilogue)."""
    import cupy
    from caffe.blob import context
    from caffe.layers import conv_base
    from caffe.layers.testing import blobs_from_arrays, empty_tops
    x = np.array([np.nan, -0.0, 0.0, -1.0, 2.0, -np.inf, np.inf, 0.75, -0.5], np.float32)
    context.set_mode(context.GPU)
    try:
        layer = make_layer(*layer_text)
        bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        want = top[0].data.copy()
    finally:
        context.set_mode_cpu()
    out = cupy.asarray(x)
    conv_base.apply_epilogue(cupy, out, act)
    got = cupy.asnumpy(out)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0]) and got[3] != -1  # NaN stays NaN on the device; -1 was changed
