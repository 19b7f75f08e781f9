"""Mutation survivors of the device path (docs/MUTATION.md, layers-gpu and layers-cuda): the cases the
property tests did not draw. gpu-marked tests run the device path under the CuPy stand-in (CI's second run)
or on a real GPU; [host] tests run the hand-written CUDA kernels' wrappers on the host (caffe.layers.cuda_host)
in the default run."""
from __future__ import annotations

import numpy as np
import pytest

from caffe.blob import context
from caffe.layers.registry import create_layer
from caffe.layers.testing import blobs_from_arrays, cpu_gpu_runs, empty_tops, gpu_available, layer_param

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")


def _both_modes(type_name, text, arrays, n_top=1, seed=0, dtype=np.float32, propagate=None):
    """[tops' data..., bottoms' diffs...] of a fresh layer in CPU mode, then in GPU mode (top diffs drawn
    from default_rng(seed), the same in both)."""
    def normal_diffs(shapes):
        rng = np.random.default_rng(seed)
        return [rng.normal(size=s) for s in shapes]
    runs = cpu_gpu_runs(layer_param(type_name, text), arrays, n_top, normal_diffs, 1701, dtype, propagate)
    return [tops + bottom_diffs for tops, bottom_diffs, _ in runs]


# -- pool_device --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", ["AVE", "MAX"])
def test_pool_window_of_the_image_with_pad_is_not_global(method):
    # kernel = the image, pad 1 and a stride past the image: ONE output (Caffe drops the window starting in
    # the padding), whose window covers rows -1..1 of a 3-row image, not the whole image: not the global
    # shortcut (row 2 gets no gradient, AVE's divisor counts the padded row)
    text = "pooling_param { pool: %s kernel_size: 3 pad: 1 stride: 5 }" % method
    x = np.random.default_rng(3).normal(size=(2, 2, 3, 3)).astype(np.float32)
    cpu, gpu = _both_modes("Pooling", text, [x])
    assert cpu[0].shape == (2, 2, 1, 1)
    assert not cpu[-1][..., 2, :].any()
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


# -- device.cached ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
def test_cached_values_are_kept_per_array_module_and_device():
    # a value built for one device (or for NumPy) is never handed to another: the stand-in refuses arrays
    # of another device than the current one, as CuPy does
    import cupy
    from caffe.layers import device
    key = ("mutation-test", 7)
    host = device.cached(np, key, lambda: np.arange(3))
    on0 = device.cached(cupy, key, lambda: cupy.arange(3))
    assert isinstance(host, np.ndarray) and isinstance(on0, cupy.ndarray) and on0.device.id == 0
    with cupy.cuda.Device(1):
        on1 = device.cached(cupy, key, lambda: cupy.arange(3))
        assert on1.device.id == 1
        assert device.cached(cupy, key, lambda: None) is on1  # built once per device
    assert device.cached(cupy, key, lambda: None) is on0
    assert device.device_id(np) == -1


def test_cached_is_bounded():
    from caffe.layers import device
    for i in range(600):
        device.cached(np, ("mutation-bound", i), lambda: i)
        assert len(device._cache) <= 513
    assert device.cached(np, ("mutation-bound", 599), lambda: None) == 599  # kept after the last clear


# -- conv_device --------------------------------------------------------------------------------------------
def _geometry(kernel, stride, pad, dilation, im):
    from caffe.layers import conv_base
    col = tuple((n + 2 * p - (d * (k - 1) + 1)) // s + 1 for n, k, s, p, d in zip(im, kernel, stride, pad, dilation))
    return conv_base.ConvGeometry(kernel, stride, pad, dilation, im, col)


LOWERINGS = [  # (kernel, stride, pad, dilation, image): 1x1 kernels with and without padding or stride
    ((1, 1), (1, 1), (0, 0), (1, 1), (3, 4)),
    ((1, 1), (1, 1), (1, 0), (1, 1), (3, 4)),
    ((1, 1), (1, 1), (0, 2), (1, 1), (2, 3)),
    ((1, 1), (2, 1), (0, 0), (1, 1), (4, 3)),
    ((1,), (1,), (1,), (1,), (5,)),
    ((1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), (2, 2, 3)),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("nb", [1, 2])
@pytest.mark.parametrize("layout", ["batch", "image"])
@pytest.mark.parametrize("case", LOWERINGS)
def test_device_lowering_of_one_by_one_kernels(case, layout, nb):
    # only a 1x1 kernel with stride 1 and NO padding is a plain copy (Caffe's is_1x1); with padding the
    # columns hold the zero border too
    import cupy
    from caffe.layers import conv_base, conv_device
    geom = _geometry(*case)
    c = 2
    rng = np.random.default_rng(5)
    im = rng.normal(size=(nb, c) + geom.im_shape).astype(np.float32)
    K, P = geom.kernel_count, geom.col_count
    shape = (c * K, nb * P) if layout == "batch" else (nb, c * K, P)
    ref = np.empty(shape, np.float32)
    conv_base.im2col(np, im, ref, geom, layout, force_nd=True)
    col = cupy.full(shape, np.nan, np.float32)
    conv_device.im2col(cupy, cupy.asarray(im), col, geom, layout)
    np.testing.assert_array_equal(cupy.asnumpy(col), ref)
    dcol = rng.normal(size=shape).astype(np.float32)
    ref_im = np.empty(im.shape, np.float32)
    conv_base.col2im(np, dcol, ref_im, geom, layout, force_nd=True)
    out = cupy.full(im.shape, np.nan, np.float32)
    conv_device.col2im(cupy, cupy.asarray(dcol), out, geom, layout)
    np.testing.assert_allclose(cupy.asnumpy(out), ref_im, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("hw", [(5, 4), (4, 5)])
def test_pool_device_geometries_differing_only_in_rounding_do_not_share_indices(hw):
    # the same kernel, stride, pad and image give 3 windows along the odd axis (CEIL) or 2 (FLOOR), 2 along
    # the other: the device keeps index arrays per geometry, and these two must not share theirs (MAX's
    # argmax top shows a wrong one)
    x = np.random.default_rng(11).normal(size=(1, 2) + hw).astype(np.float32)
    for mode in ("CEIL", "FLOOR", "CEIL"):
        text = "pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: %s }" % mode
        cpu, gpu = _both_modes("Pooling", text, [x], n_top=2)
        odd = 3 if mode == "CEIL" else 2
        assert cpu[0].shape[2:] == ((odd, 2) if hw[0] == 5 else (2, odd))
        for a, b in zip(cpu, gpu):
            np.testing.assert_array_equal(b, a)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", ["AVE", "MAX"])
@pytest.mark.parametrize("geometry, hw", [
    ("kernel_size: 2 stride: 5 round_mode: FLOOR", (3, 3)),  # one window, smaller than the image
    ("kernel_size: 3 pad_h: 1 pad_w: 0 stride: 5", (3, 3)),  # one window of the image's size, padded on h only
    ("kernel_size: 3 pad_h: 0 pad_w: 1 stride: 5", (3, 3)),
    ("kernel_size: 3 stride: 5", (3, 3)),  # the global window
])
def test_pool_single_windows_on_the_device(method, geometry, hw):
    text = "pooling_param { pool: %s %s }" % (method, geometry)
    x = np.random.default_rng(13).normal(size=(2, 3) + hw).astype(np.float32)
    cpu, gpu = _both_modes("Pooling", text, [x])
    assert cpu[0].shape[2:] == (1, 1)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@needs_gpu
def test_pool_device_images_of_other_widths_do_not_share_indices():
    # widths 4 and 5 give the same 2 windows a row (FLOOR): the gather's flat positions depend on the width
    text = "pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR }"
    for w in (4, 5, 4):
        x = np.random.default_rng(w).normal(size=(1, 2, 4, w)).astype(np.float32)
        cpu, gpu = _both_modes("Pooling", text, [x], n_top=2)
        assert cpu[0].shape == (1, 2, 2, 2)
        for a, b in zip(cpu, gpu):
            np.testing.assert_array_equal(b, a)


def test_device_kernels_run_only_for_device_arrays_where_not_turned_off(monkeypatch):
    # device.kernels: a real GPU (faked here), arrays of a module other than NumPy, CAFFE_DEVICE_KERNELS not "0"
    import types
    from caffe.blob import context as ctx
    from caffe.layers import device
    gpu_module = types.ModuleType("cupy")
    monkeypatch.setattr(ctx, "device_kernels_available", lambda: True)
    monkeypatch.delenv("CAFFE_DEVICE_KERNELS", raising=False)
    assert device.kernels(gpu_module) and not device.kernels(np)
    for value, on in (("1", True), ("0", False), ("", True)):
        monkeypatch.setenv("CAFFE_DEVICE_KERNELS", value)
        assert device.kernels(gpu_module) is on and not device.kernels(np)
    monkeypatch.setattr(ctx, "device_kernels_available", lambda: False)
    monkeypatch.delenv("CAFFE_DEVICE_KERNELS")
    assert not device.kernels(gpu_module)


# -- the hand-written CUDA kernels' wrappers, run on the host (caffe.layers.cuda_host) -----------------------
def _host_run(type_name, text, x, dtype, inplace, on):
    return _host_run_bottoms(type_name, text, [x], dtype, inplace, on)


def _host_run_bottoms(type_name, text, xs, dtype, inplace, on, phase=0, propagate=None, marks=None):
    """tops' data and bottoms' diffs of forward_xp / backward_xp with NumPy: the CUDA kernels on the host
    (on) or the array-API path; with them on, the names of the kernels built (marks: "|" between forward's
    and backward's)."""
    import contextlib
    from caffe.layers import cuda_host
    from caffe.layers import device as dev
    from caffe.layers.testing import make_layer
    names = []
    build = dev.raw_kernel
    with (cuda_host.emulating() if on else contextlib.nullcontext()):
        if on:
            inner = dev.raw_kernel
            dev.raw_kernel = lambda name, source, dt: names.append(name) or inner(name, source, dt)
        try:
            context.set_random_seed(5)
            layer = make_layer(type_name, text, phase=phase)
            bottom = blobs_from_arrays(xs, dtype)
            top = [bottom[0]] if inplace else empty_tops(1, dtype)
            layer.SetUp(bottom, top)
            context.set_random_seed(5)
            layer.forward_xp(np, bottom, top)
            if marks:
                names.append("|")
            y = top[0].cpu_data().copy()
            top[0].mutable_diff_xp(np)[...] = np.random.default_rng(6).normal(size=top[0].shape)
            layer.backward_xp(np, top, propagate or [True] * len(bottom), bottom)
            return [y] + [b.cpu_diff().copy() for b in bottom], names
        finally:
            if on:
                dev.raw_kernel = inner
    assert dev.raw_kernel is build


HOST_NEURONS = [("ReLU", ""), ("ReLU", "relu_param { negative_slope: -0.5 }"), ("Sigmoid", ""), ("TanH", ""),
                ("ELU", "elu_param { alpha: 0.7 }"), ("BNLL", ""), ("Swish", "swish_param { beta: 1.3 }"),
                ("Dropout", "dropout_param { dropout_ratio: 0.3 }")]


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("case", HOST_NEURONS, ids=[f"{t}{i}" for i, (t, _) in enumerate(HOST_NEURONS)])
def test_every_neuron_kernel_on_the_host(case, inplace, dtype):
    # every neuron kernel runs in the default run (the device-kernel property samples one case per draw,
    # and its 12 CI draws never drew ELU)
    x = np.random.default_rng(4).normal(scale=3, size=(2, 3, 5)).astype(dtype)
    x[0, 0, :2] = 0  # the kernels' branch points
    (on, names) = _host_run(*case, x, dtype, inplace, True)
    (off, _) = _host_run(*case, x, dtype, inplace, False)
    assert names, "no kernel ran"
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("op, kernels", [
    ("MAX", ["max_pair", "max_next", "max_route"]),
    ("SUM", ["axpby", "accumulate", "axpby"]),
    ("SUM coeff: 0.5 coeff: -2 coeff: 3", ["axpby", "accumulate", "axpby"]),
])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("n", [2, 3])
def test_eltwise_kernels_forward_and_backward_on_the_host(op, kernels, inplace, n):
    # three bottoms: the pair kernel, then one more, and the backward's kernel for each bottom, all run (a
    # backward that declined, or ran and then fell back to the array path, gave the same values unseen)
    rng = np.random.default_rng(8)
    xs = [rng.normal(size=(2, 3, 4)) for _ in range(n)]
    xs[1][0, 0] = xs[0][0, 0]  # MAX ties: the first bottom wins
    text = "eltwise_param { operation: %s }" % (op if n == 3 else op.replace(" coeff: 3", ""))
    (on, names) = _host_run_bottoms("Eltwise", text, xs, np.float32, inplace, True)
    (off, _) = _host_run_bottoms("Eltwise", text, xs, np.float32, inplace, False)
    forward, backward = names[:n - 1], names[n - 1:]
    assert forward == kernels[:n - 1], names
    # in place (top = bottom[0]) the backward declines: bottom[0]'s diff is the top's diff
    assert backward == ([] if inplace else [kernels[2]] * n), names
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_kernels_with_and_without_the_three_quarter_power_on_the_host(region, beta):
    # beta 0.75 takes the kernels' rsqrt path, any other beta pow(): both, each region, forward and backward
    text = "lrn_param { local_size: 3 alpha: 0.5 beta: %s k: 1.5 norm_region: %s }" % (beta, region)
    x = np.random.default_rng(9).normal(size=(2, 4, 3, 3))
    (on, names) = _host_run("LRN", text, x, np.float64, False, True)
    (off, _) = _host_run("LRN", text, x, np.float64, False, False)
    assert len(names) == 2, names
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


_R = np.random.default_rng(12)
ACROSS, WITHIN = "lrn_param { local_size: 3 alpha: 0.5 beta: %s k: 1.5 }", \
    "lrn_param { local_size: 3 alpha: 0.5 beta: %s norm_region: WITHIN_CHANNEL }"
STO = "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 1 }"
# (layer, parameters, bottoms, in place, phase, the kernels forward then backward run ("|" between))
HOST_LAYERS = [
    ("Softmax", "", [_R.normal(size=(2, 5))], False, 0, "softmax_rows | softmax_backward_rows"),
    ("Softmax", "", [_R.normal(size=(2, 3, 2))], False, 0, "softmax_strided | softmax_backward_strided"),
    ("Softmax", "softmax_param { axis: 0 }", [_R.normal(size=(3, 1))], False, 0,
     "softmax_rows | softmax_backward_rows"),
    ("Softmax", "", [_R.normal(size=(1, 1))], False, 0, "softmax_rows | softmax_backward_rows"),
    ("SoftmaxWithLoss", "", [_R.normal(size=(2, 3)), [0.0, 2.0]], False, 0,
     "softmax_rows softmax_loss_forward | softmax_loss_backward"),
    ("SoftmaxWithLoss", "loss_param { ignore_label: 1 }", [_R.normal(size=(2, 3, 2)), [[0.0, 1.0], [2.0, 1.0]]],
     False, 0, "softmax_strided softmax_loss_forward | softmax_loss_backward"),
    ("SoftmaxWithLoss", "", [_R.normal(size=(1, 1)), [0.0]], False, 0,
     "softmax_rows softmax_loss_forward | softmax_loss_backward"),
    ("BatchNorm", "", [_R.normal(size=(2, 3, 2))], False, 0,
     "bn_stats channel_affine | bn_backward_stats bn_backward_apply"),
    ("BatchNorm", "", [_R.normal(size=(2, 3, 2))], True, 0,
     "bn_stats channel_affine | bn_backward_stats bn_backward_apply"),
    ("BatchNorm", "", [_R.normal(size=(1, 1, 3))], False, 0,
     "bn_stats channel_affine | bn_backward_stats bn_backward_apply"),
    ("BatchNorm", "", [_R.normal(size=(1, 1, 1))], False, 0,
     "bn_stats channel_affine | bn_backward_stats bn_backward_apply"),
    ("BatchNorm", "batch_norm_param { use_global_stats: true }", [_R.normal(size=(2, 3, 2))], False, 0,
     "channel_affine | channel_affine"),
    ("LRN", ACROSS % 0.6, [_R.normal(size=(2, 4, 2, 2))], False, 0, "lrn_forward | lrn_backward"),
    ("LRN", ACROSS % 0.6, [_R.normal(size=(2, 4, 2, 2))], True, 0, "lrn_forward |"),
    ("LRN", ACROSS % 0.75, [_R.normal(size=(1, 1, 1, 1))], False, 0, "lrn_forward | lrn_backward"),
    ("LRN", WITHIN % 0.6, [_R.normal(size=(2, 2, 3, 3))], False, 0, "lrn_within_forward | lrn_within_backward"),
    ("LRN", WITHIN % 0.6, [_R.normal(size=(2, 2, 3, 3))], True, 0, "|"),
    ("LRN", WITHIN % 0.75, [_R.normal(size=(1, 1, 1, 1))], False, 0, "lrn_within_forward | lrn_within_backward"),
    ("Pooling", STO, [np.abs(_R.normal(size=(1, 2, 3, 3)))], False, 0, "sto_pool_forward_train |"),
    ("Pooling", STO, [np.abs(_R.normal(size=(1, 2, 3, 3)))], False, 1, "sto_pool_forward_test |"),
]


@pytest.mark.skipif(not __import__("caffe.layers.cuda_host", fromlist=["x"]).available(),
                    reason="no host C++ compiler to run the CUDA sources")
@pytest.mark.parametrize("case", HOST_LAYERS, ids=[f"{c[0]}{i}" for i, c in enumerate(HOST_LAYERS)])
def test_each_layer_kernel_runs_where_it_applies_on_the_host(case):
    # the parity properties check that SOME kernel ran per call: a kernel that declined where it applies
    # (a 1-element blob, a guard inverted), or a forward kernel skipped while the backward's ran, gave the
    # array path's values unseen; here each call's kernels are named, one-element blobs and inner == 1 vs
    # inner > 1 (rows vs strided) included, and in place where a kernel must decline (it would read what it
    # wrote): LRN's backward, and WITHIN_CHANNEL's forward
    type_name, text, xs, inplace, phase, expected = case
    propagate = [True, False] if len(xs) > 1 else None
    on, names = _host_run_bottoms(type_name, text, xs, np.float32, inplace, True, phase, propagate, marks=True)
    off, _ = _host_run_bottoms(type_name, text, xs, np.float32, inplace, False, phase, propagate)
    assert " ".join(names) == expected
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_floats_takes_one_float_dtype_in_c_order_only():
    # what every hand-written kernel assumes of its arrays (T = float or double for all, flat indexing): a
    # float64 array among float32 ones, a non-contiguous view or integers must send the caller to the array path
    from caffe.layers import device
    f32, f64 = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)
    assert device.floats(np, f32, f32) and device.floats(np, f64)
    assert not device.floats(np, f32, f64) and not device.floats(np, f64, f32)
    assert not device.floats(np, f32, f32.T) and not device.floats(np, f32[:, ::2])
    assert not device.floats(np, np.zeros(3, np.int32)) and not device.floats(np, np.zeros(3, np.float16))


@pytest.mark.gpu
@needs_gpu
def test_address_of_device_arrays_is_their_device_pointer():
    # the in-place checks of the kernels compare device pointers (CuPy arrays have no .ctypes)
    import cupy
    from caffe.layers import device
    a = cupy.arange(6, dtype=cupy.float32)
    assert device.address(a) == a.data.ptr
    assert device.address(a[2:]) - device.address(a) == 8
    h = np.arange(6, dtype=np.float32)
    assert device.address(h) == h.ctypes.data


# -- the device branches of the layers (layers-gpu2): loss normalizer, cross-mode state ----------------------
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("norm", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("valid", [0, 1, 2])
def test_softmax_loss_normalizer_on_the_device_with_few_valid_labels(norm, valid):
    # the device keeps VALID's count on the device (max(count, 1), no copy): no valid label gives loss 0 and
    # no gradient, one valid label is divided by 1, as on the host
    x = np.random.default_rng(21).normal(size=(2, 3, 2))
    labels = np.full((2, 2), 7.0)
    labels.flat[:valid] = [2.0, 0.0][:valid]
    text = "loss_param { ignore_label: 7 normalization: %s }" % norm
    cpu, gpu = _both_modes("SoftmaxWithLoss", text, [x, labels], propagate=[True, False])
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    if valid == 0:
        assert cpu[0] == 0 and not cpu[1].any()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("type_name, text, shape, expected", [
    ("Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 1 }", (2, 2, 4, 3),
     ["pool_device.max_forward", "pool_device.scatter_back"]),
    ("Pooling", "pooling_param { pool: AVE kernel_size: 2 stride: 1 pad: 1 }", (2, 2, 4, 3),
     ["pool_device.ave_forward", "pool_device.ave_backward"]),
    ("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 1 }", (2, 2, 4, 3),
     ["pool_device.stochastic_windows", "pool_device.scatter_back"]),
    ("Convolution", "convolution_param { num_output: 4 kernel_size: 2 weight_filler { type: 'gaussian' } "
                    "bias_filler { type: 'gaussian' } }", (2, 3, 4, 3),
     ["conv_device.im2col", "BaseConvolutionLayer._gemm_forward_device", "conv_device.col2im"]),
    # grouped, past the exact (float64) forward's 32 terms
    ("Convolution", "convolution_param { num_output: 4 group: 2 kernel_size: 5 weight_filler { type: 'gaussian' } }",
     (1, 4, 7, 6), ["conv_device.im2col", "BaseConvolutionLayer._gemm_forward_device", "conv_device.col2im"]),
])
def test_gpu_mode_runs_the_device_paths(monkeypatch, type_name, text, shape, expected):
    # the generic array path also runs on the device and gives the same values, so a device dispatch turned off
    # (`xp is np` for `xp is not np`) was seen by no parity test: here the device functions must be the ones run
    # (one gather / scatter per call, and every group in one batched matmul, instead of one launch per kernel
    # offset and per group); the values match the CPU's
    # (only calls with the device's array module count: a dispatch inverted to `xp is np` sends the CPU run
    # to the device function, with NumPy, and the device run to the generic path)
    from caffe.layers import conv_base, conv_device, pool_device
    called = []

    def spy(owner, name, label):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            xp = next(a for a in args if a is np or getattr(a, "__name__", None) == "cupy")
            if xp is not np:
                called.append(label)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapped)
    for name in ("max_forward", "ave_forward", "ave_backward", "scatter_back", "stochastic_windows"):
        spy(pool_device, name, f"pool_device.{name}")
    spy(conv_device, "im2col", "conv_device.im2col")
    spy(conv_device, "col2im", "conv_device.col2im")
    spy(conv_base.BaseConvolutionLayer, "_gemm_forward_device", "BaseConvolutionLayer._gemm_forward_device")
    x = np.random.default_rng(22).uniform(0.1, 1, size=shape)
    cpu, gpu = _both_modes(type_name, text, [x])
    assert sorted(set(called)) == sorted(expected), called
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("num, group", [(1, 1), (3, 1), (2, 2)])
def test_short_float32_forward_on_the_device_is_the_correctly_rounded_float64_one(num, group):
    # the device's exact forward (float64 lowering, one batched matmul, the bias added in float64, one
    # rounding): bit for bit the float64 result rounded to float32, as on the host; a forward that lowered
    # or summed in float32 stayed within every parity tolerance
    from caffe.layers import conv_base
    rng = np.random.default_rng(7)
    x = rng.normal(size=(num, 2, 9, 8)).astype(np.float32)
    outs = []
    for dtype, mode in ((np.float32, context.GPU), (np.float64, context.CPU)):
        context.set_mode(mode)
        try:
            context.set_random_seed(3)
            layer = create_layer(layer_param("Convolution", "convolution_param { num_output: 4 kernel_size: 3 "
                                             "group: %d weight_filler { type: 'gaussian' std: 0.5 } "
                                             "bias_filler { type: 'gaussian' std: 0.5 } }" % group))
            bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
            layer.SetUp(bottom, top)
            assert layer.kernel_dim <= conv_base.EXACT_FORWARD_MAX_K
            for b in layer.blobs:  # the same float32-representable parameters in both runs
                b.data[...] = b.data.astype(np.float32)
            layer.Forward(bottom, top)
            outs.append(top[0].data.copy())
        finally:
            context.set_mode_cpu()
    np.testing.assert_array_equal(outs[0], outs[1].astype(np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("norm", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_softmax_loss_on_the_device_copies_nothing_to_the_host(norm):
    # the normalizer (VALID's count of valid labels too), the label check and Backward's scale stay on the
    # device: a forward and backward on device data move nothing to the host (a VALID count copied by
    # int(count), the host's label check (bool(bad.any())) or the normalizer read back by float() gave the
    # same values, a sync each). The values match CPU mode's.
    if not context.cupy_standin():
        pytest.skip("the transfer count is the CuPy stand-in's")
    import cupy
    x = np.random.default_rng(23).normal(size=(2, 3, 2))
    labels = np.array([[0.0, 7.0], [2.0, 1.0]])
    text = "loss_param { ignore_label: 7 normalization: %s }" % norm
    runs = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            layer = create_layer(layer_param("SoftmaxWithLoss", text))
            bottom, top = blobs_from_arrays([x, labels], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            if mode == context.GPU:
                for b in bottom:
                    b.gpu_data()  # the inputs on the device first: their upload is not the layer's
                top[0].mutable_gpu_diff()[...] = 1.5
            else:
                top[0].mutable_cpu_diff()[...] = 1.5
            with cupy.__caffe_transfers__.counting() as moved:
                layer.Forward(bottom, top)
                layer.Backward(top, [True, False], bottom)
            runs.append((moved["d2h"], top[0].data.copy(), bottom[0].diff.copy()))
        finally:
            context.set_mode_cpu()
    (_, loss_cpu, dx_cpu), (d2h, loss_gpu, dx_gpu) = runs
    assert d2h == 0
    np.testing.assert_allclose(loss_gpu, loss_cpu, rtol=1e-5)
    np.testing.assert_allclose(dx_gpu, dx_cpu, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bad", [3.0, -1.0])
def test_softmax_loss_bad_label_on_the_device_is_named_at_the_next_read(bad):
    # on the device the label check is deferred (no copy per forward): the forward runs, and the next read of
    # a loss raises the layer's error naming the FIRST bad label (the first label here is a good one), once
    from caffe.blob import deferred
    from caffe.layers import LayerError
    x = np.zeros((4, 3))
    context.set_mode_gpu()
    try:
        deferred.discard()
        layer = create_layer(layer_param("SoftmaxWithLoss", "loss_param { ignore_label: 5 }", name="loss"))
        bottom, top = blobs_from_arrays([x, np.array([0.0, 5.0, bad, 4.0])], np.float32), empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        with pytest.raises(LayerError, match=rf"'loss' \(SoftmaxWithLoss\): label value {bad:g} is out of range: "
                                             r"labels must be integers in \[0, 3\) or the ignore_label 5 "
                                             r"\(found on the device; raised at the next read of a loss\)$"):
            deferred.flush()
        deferred.flush()  # raised once
    finally:
        deferred.discard()
        context.set_mode_cpu()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("num", [1, 3])
def test_convolution_layer_run_in_both_modes_keeps_its_buffers_apart(num):
    # the batched path's scratch buffers (the bias gradient's ones vector, the column buffers) are kept per
    # array module: ONE layer run in CPU mode (N-d lowering: the batched path there too), then in GPU mode,
    # then in CPU mode again gives the same tops and gradients each time (a NumPy buffer handed to the device,
    # or a device one to the host, is refused, as CuPy refuses it)
    x = np.random.default_rng(24).normal(size=(num, 2, 5, 4))
    dy = None
    context.set_random_seed(5)
    layer = create_layer(layer_param("Convolution", "convolution_param { num_output: 3 kernel_size: 2 "
                                     "force_nd_im2col: true weight_filler { type: 'gaussian' } "
                                     "bias_filler { type: 'gaussian' } }"))
    bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    runs = []
    for mode in (context.CPU, context.GPU, context.CPU):
        context.set_mode(mode)
        try:
            for p in layer.blobs:
                p.diff[...] = 0
            layer.Forward(bottom, top)
            if dy is None:
                dy = np.random.default_rng(25).normal(size=top[0].shape)
            top[0].diff[...] = dy
            layer.Backward(top, [True], bottom)
            runs.append([top[0].data.copy(), bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs])
        finally:
            context.set_mode_cpu()
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _conv(text, seed):
    context.set_random_seed(seed)
    return create_layer(layer_param("Convolution", "convolution_param { %s weight_filler { type: 'gaussian' } "
                                                   "bias_filler { type: 'gaussian' } }" % text))


@pytest.mark.gpu
@needs_gpu
def test_device_column_buffer_kept_for_backward_is_the_layers_own():
    # forward keeps its column buffer for backward (one-chunk batches; float32 past the exact forward's 32
    # terms): that buffer is the layer's, while the per-call scratch buffers are shared by every convolution
    # layer of the thread (Caffe's memory). A and B forward, then A backward: A's weight gradient from A's
    # input, as when A runs alone. Scratch buffers are reused: the same memory for the same or a smaller size.
    text = "num_output: 2 kernel_size: 3"  # 4 channels x 3 x 3 = 36 terms
    rng = np.random.default_rng(26)
    xa, xb = rng.normal(size=(2, 4, 5, 5)), rng.normal(size=(2, 4, 5, 5))
    context.set_mode_gpu()
    try:
        grads = []
        for with_b in (False, True):
            a, b = _conv(text, 1), _conv(text, 2)
            ba, ta = blobs_from_arrays([xa], np.float32), empty_tops(1, np.float32)
            bb, tb = blobs_from_arrays([xb], np.float32), empty_tops(1, np.float32)
            a.SetUp(ba, ta)
            b.SetUp(bb, tb)
            assert a.kernel_dim > 32
            a.Forward(ba, ta)
            if with_b:
                b.Forward(bb, tb)
            ta[0].diff[...] = 1.0
            a.Backward(ta, [True], ba)
            grads.append([p.diff.copy() for p in a.blobs] + [ba[0].diff.copy()])
        for g0, g1 in zip(*grads):
            np.testing.assert_allclose(g1, g0, rtol=1e-6, atol=1e-6)
        import cupy
        # (a name of its own: the thread's "col" may be larger already, from an earlier test)
        big = a.buffer(cupy, "mutation-test", (6, 4), np.float32)
        small = b.buffer(cupy, "mutation-test", (3, 4), np.float32)  # another layer, the same scratch
        same = a.buffer(cupy, "mutation-test", (3, 4), np.float32)
        again = a.buffer(cupy, "mutation-test", (6, 4), np.float32)  # exactly the size it has
        assert big.data.ptr == small.data.ptr == same.data.ptr == again.data.ptr
        own_a, own_b = a.buffer(cupy, ("col", 0), (3,), np.float32), b.buffer(cupy, ("col", 0), (3,), np.float32)
        assert own_a.data.ptr != own_b.data.ptr
        ones = [a.ones(cupy, n, np.float32) for n in (64, 64, 2)]  # the bias gradient's ones, kept
        assert len({o.data.ptr for o in ones}) == 1 and all((o == 1).all() for o in ones)
    finally:
        context.set_mode_cpu()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kernel", [2, 3])  # within and past the exact forward's 32 terms
def test_device_matmuls_do_not_grow_with_the_groups(monkeypatch, kernel):
    # on the device every group goes in ONE batched matmul (forward, data gradient, weight gradient): a
    # grouped layer makes as many matmul calls as an ungrouped one (a per-group loop there gives the same
    # values, one launch per group)
    import cupy
    counts = []
    real = cupy.matmul

    def counted(*args, **kwargs):
        counts[-1] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(cupy, "matmul", counted)
    x = np.random.default_rng(27).normal(size=(2, 8, 5, 5))
    context.set_mode_gpu()
    try:
        for group in (1, 4):
            layer = _conv("num_output: 8 kernel_size: %d group: %d" % (kernel, group), 3)
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            counts.append(0)
            layer.Forward(bottom, top)
            top[0].diff[...] = 1.0
            layer.Backward(top, [True], bottom)
    finally:
        context.set_mode_cpu()
    assert counts[0] == counts[1] > 0, counts
