"""Mutation survivors of the device path (docs/MUTATION.md, layers-gpu and layers-cuda): the cases the
property tests did not draw. gpu-marked tests run the device path under the CuPy stand-in (CI's second run)
or on a real GPU; [host] tests run the hand-written CUDA kernels' wrappers on the host (caffe.layers.cuda_host)
in the default run."""
from __future__ import annotations

import numpy as np
import pytest

from caffe.blob import context
from caffe.layers.registry import create_layer
from caffe.layers.testing import blobs_from_arrays, empty_tops, gpu_available, layer_param

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")


def _both_modes(type_name, text, arrays, n_top=1, seed=0, dtype=np.float32):
    """[tops' data..., bottoms' diffs...] of a fresh layer in CPU mode, then in GPU mode."""
    results = []
    for mode in (context.CPU, context.GPU):
        context.set_mode(mode)
        try:
            context.set_random_seed(1701)
            layer = create_layer(layer_param(type_name, text))
            bottom, top = blobs_from_arrays(arrays, dtype), empty_tops(n_top, dtype)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            rng = np.random.default_rng(seed)
            for t in top:
                t.diff[...] = rng.normal(size=t.shape)
            layer.Backward(top, [True] * len(bottom), bottom)
            results.append([t.data.copy() for t in top] + [b.diff.copy() for b in bottom])
        finally:
            context.set_mode_cpu()
    return results


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


def _host_run_bottoms(type_name, text, xs, dtype, inplace, on):
    """tops' data and bottoms' diffs of forward_xp / backward_xp with NumPy: the CUDA kernels on the host
    (on) or the array-API path; with them on, the names of the kernels built."""
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
            layer = make_layer(type_name, text)
            bottom = blobs_from_arrays(xs, dtype)
            top = [bottom[0]] if inplace else empty_tops(1, dtype)
            layer.SetUp(bottom, top)
            context.set_random_seed(5)
            layer.forward_xp(np, bottom, top)
            y = top[0].cpu_data().copy()
            top[0].mutable_diff_xp(np)[...] = np.random.default_rng(6).normal(size=top[0].shape)
            layer.backward_xp(np, top, [True] * len(bottom), bottom)
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
