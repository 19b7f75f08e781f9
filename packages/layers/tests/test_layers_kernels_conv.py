"""Convolution's CPU plans (conv_cpu: 1x1, direct, blocked) and the direct kernel against NumPy references.

The references: a direct float64 convolution written with NumPy slicing (this file), and the generic
batched path of conv_base (CPU_PATHS = False), which the GPU runs.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import conv_base, conv_cpu
from caffe.layers.kernels import depthwise
from caffe.layers.testing import blobs_from_arrays, check_layer_gradient, empty_tops, make_layer

FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"


# -- a NumPy reference of the three products ----------------------------------------------------

def _taps(x_shape, k, s, p, d):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, s, p, d
    H, W = x_shape[2:]
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    for i in range(kh):
        for j in range(kw):
            yield i, j, (slice(None), slice(None), slice(i * dh, i * dh + sh * (OH - 1) + 1, sh),
                         slice(j * dw, j * dw + sw * (OW - 1) + 1, sw))


def ref_forward(x, w, b, k, s, p, d, group):
    """float64 y = conv(x, w) + b by slices of the zero-padded x, per group."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C = x.shape[:2]
    Co, cg = w.shape[:2]
    og = Co // group
    xp = np.pad(x, [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])])
    y = None
    for i, j, sl in _taps(x.shape, k, s, p, d):
        patch = xp[sl].reshape(N, group, cg, *xp[sl].shape[2:])
        term = np.einsum("ngchw,goc->ngohw", patch, w[:, :, i, j].reshape(group, og, cg))
        y = term if y is None else y + term
    y = y.reshape(N, Co, *y.shape[3:])
    return y if b is None else y + b.astype(np.float64).reshape(1, Co, 1, 1)


def ref_backward_data(dy, w, x_shape, k, s, p, d, group):
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    N, C = x_shape[:2]
    Co, cg = w.shape[:2]
    og = Co // group
    dxp = np.zeros((N, C, x_shape[2] + 2 * p[0], x_shape[3] + 2 * p[1]))
    dyg = dy.reshape(N, group, og, *dy.shape[2:])
    for i, j, sl in _taps(x_shape, k, s, p, d):
        term = np.einsum("ngohw,goc->ngchw", dyg, w[:, :, i, j].reshape(group, og, cg))
        dxp[sl] += term.reshape(N, C, *dy.shape[2:])
    return dxp[:, :, p[0]:p[0] + x_shape[2], p[1]:p[1] + x_shape[3]]


def ref_backward_weight(x, dy, w_shape, k, s, p, d, group):
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    N, C = x.shape[:2]
    Co, cg = w_shape[:2]
    og = Co // group
    xp = np.pad(x, [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])])
    dw = np.zeros(w_shape)
    dyg = dy.reshape(N, group, og, *dy.shape[2:])
    for i, j, sl in _taps(x.shape, k, s, p, d):
        patch = xp[sl].reshape(N, group, cg, *xp[sl].shape[2:])
        dw[:, :, i, j] = np.einsum("ngohw,ngchw->goc", dyg, patch).reshape(Co, cg)
    return dw


@st.composite
def direct_cases(draw, max_side=7):
    group = draw(st.integers(1, 4))
    cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    sizes = []
    for a in range(2):
        lo = max(1, d[a] * (k[a] - 1) + 1 - 2 * p[a])
        sizes.append(draw(st.integers(lo, lo + max_side)))
    N = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    return dict(N=N, C=cg * group, Co=og * group, group=group, HW=tuple(sizes), k=k, s=s, p=p, d=d,
                dtype=dtype, seed=draw(st.integers(0, 2**31 - 1)))


def _arrays(case):
    rng = np.random.default_rng(case["seed"])
    dt = case["dtype"]
    N, C, Co, group = case["N"], case["C"], case["Co"], case["group"]
    (H, W), k, s, p, d = case["HW"], case["k"], case["s"], case["p"], case["d"]
    OH = (H + 2 * p[0] - (d[0] * (k[0] - 1) + 1)) // s[0] + 1
    OW = (W + 2 * p[1] - (d[1] * (k[1] - 1) + 1)) // s[1] + 1
    x = rng.normal(size=(N, C, H, W)).astype(dt)
    w = rng.normal(size=(Co, C // group) + k).astype(dt)
    b = rng.normal(size=Co).astype(dt)
    dy = rng.normal(size=(N, Co, OH, OW)).astype(dt)
    args = (N, C, H, W, Co, group, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], OH, OW)
    return x, w, b, dy, args


@given(case=direct_cases(), bias=st.booleans())
def test_direct_forward_matches_the_reference(case, bias):
    x, w, b, dy, args = _arrays(case)
    y = np.full(dy.shape, np.nan, case["dtype"])
    depthwise.forward(x.ravel(), w.ravel(), b if bias else None, y.ravel(), *args)
    ref = ref_forward(x, w, b if bias else None, case["k"], case["s"], case["p"], case["d"], case["group"])
    if case["dtype"] == np.float32:  # summed in float64 and rounded once: within an ulp of the exact sum
        np.testing.assert_array_max_ulp(y, ref.astype(np.float32), maxulp=1)
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


@given(case=direct_cases())
def test_direct_backward_matches_the_reference(case):
    x, w, b, dy, args = _arrays(case)
    tol = 1e-12 if case["dtype"] == np.float64 else 2e-5
    dx = np.full(x.shape, np.nan, case["dtype"])
    depthwise.backward_data(dy.ravel(), w.ravel(), dx.ravel(), *args)
    ref = ref_backward_data(dy, w, x.shape, case["k"], case["s"], case["p"], case["d"], case["group"])
    np.testing.assert_allclose(dx, ref, rtol=tol, atol=tol * 10)
    start = np.random.default_rng(1).normal(size=w.shape).astype(case["dtype"])
    dw = start.copy()  # gradients accumulate into the diff
    depthwise.backward_weight(x.ravel(), dy.ravel(), dw.ravel(), *args)
    ref = ref_backward_weight(x, dy, w.shape, case["k"], case["s"], case["p"], case["d"], case["group"])
    np.testing.assert_allclose(dw, start + ref, rtol=tol, atol=tol * 10)


@given(case=direct_cases(), bias=st.booleans())
def test_direct_kernels_avx2_build_gives_the_same_bits(case, bias):
    """depthwise_avx2 (the build conv_cpu uses where the CPU has AVX2) is the same source without FMA or
    contraction: forward, backward_data and backward_weight equal the baseline build bit for bit."""
    from caffe.layers import _cpu
    if not _cpu.cpu_has_avx2():
        pytest.skip("this CPU cannot run the AVX2 build")
    import importlib
    avx2 = importlib.import_module("caffe.layers.kernels.depthwise_avx2")
    x, w, b, dy, args = _arrays(case)
    outs = []
    for mod in (depthwise, avx2):
        y = np.full(dy.shape, np.nan, case["dtype"])
        mod.forward(x.ravel(), w.ravel(), b if bias else None, y.ravel(), *args)
        dx = np.full(x.shape, np.nan, case["dtype"])
        mod.backward_data(dy.ravel(), w.ravel(), dx.ravel(), *args)
        dw = np.ones(w.shape, case["dtype"])
        mod.backward_weight(x.ravel(), dy.ravel(), dw.ravel(), *args)
        outs.append((y, dx, dw))
    for a, b_ in zip(*outs):
        np.testing.assert_array_equal(a, b_)
    assert conv_cpu._dw is avx2 or not _cpu.USE_AVX2


def test_direct_kernel_refuses_bad_buffers_and_geometry():
    x, w, y = np.zeros(2 * 4 * 5 * 5), np.zeros(4 * 9), np.zeros(2 * 4 * 5 * 5)
    args = (2, 4, 5, 5, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 5, 5)
    depthwise.forward(x, w, None, y, *args)
    with pytest.raises(ValueError, match="column-side buffer too small"):
        depthwise.forward(x, w, None, y[:-1], *args)
    with pytest.raises(ValueError, match="image-side buffer too small"):
        depthwise.backward_weight(x[:-1], y, w.copy(), *args)
    with pytest.raises(ValueError, match="weight buffer too small"):
        depthwise.backward_data(y, w[:-1], x.copy(), *args)
    with pytest.raises(ValueError, match="output size does not match"):
        depthwise.forward(x, w, None, y, *args[:-1], 4)
    with pytest.raises(ValueError, match="group must divide"):
        depthwise.forward(x, w, None, y, 2, 4, 5, 5, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 5, 5)
    with pytest.raises((TypeError, ValueError), match="dtype mismatch|No matching signature"):
        depthwise.forward(x.astype(np.float32), w, None, y, *args)


# -- the layer's plans against the generic batched path --------------------------------------------

@st.composite
def layer_cases(draw):
    """A 2-D Convolution/Deconvolution whose CPU plan is `plan`, with the blocking knobs small enough that
    the blocked and 1x1 plans cut the batch into several blocks (row bands, several images)."""
    plan = draw(st.sampled_from(["1x1", "direct", "blocked"]))
    group = draw(st.integers(2, 4)) if plan == "direct" else draw(st.integers(1, 2))
    cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    if plan == "1x1":
        k, s, p, d = (1, 1), (1, 1), (0, 0), (draw(st.integers(1, 2)),) * 2
    else:
        k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        s = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        p = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
        d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        if k == (1, 1) and s == (1, 1) and p == (0, 0):
            s = (2, 1)  # not a 1x1 plan
    deconv = draw(st.booleans())
    sizes = []
    for a in range(2):
        ext = d[a] * (k[a] - 1) + 1
        lo = max(1, ext - 2 * p[a]) if not deconv else 1
        sizes.append(draw(st.integers(lo, lo + 6)))
    if deconv:
        for a in range(2):  # Deconvolution's output must be positive
            while s[a] * (sizes[a] - 1) + d[a] * (k[a] - 1) + 1 - 2 * p[a] < 1:
                sizes[a] += 1
    return dict(plan=plan, deconv=deconv, N=draw(st.integers(1, 4)), C=cg * group, num_output=og * group,
                group=group, HW=tuple(sizes), k=k, s=s, p=p, d=d, bias=draw(st.booleans()),
                dtype=draw(st.sampled_from([np.float32, np.float64])),
                block_bytes=draw(st.sampled_from([64, 512, 1 << 20])), min_cols=draw(st.sampled_from([1, 5, 256])),
                seed=draw(st.integers(0, 2**31 - 1)))


def _run_layer(case, cpu_paths, monkeypatch):
    monkeypatch.setattr(conv_base, "CPU_PATHS", cpu_paths)
    monkeypatch.setattr(conv_cpu, "COL_BLOCK_BYTES", case["block_bytes"])
    monkeypatch.setattr(conv_cpu, "MIN_BLOCK_COLS", case["min_cols"])
    monkeypatch.setattr(conv_cpu, "ONE_BY_ONE_VIEW_COLS", case["min_cols"])
    monkeypatch.setattr(conv_cpu, "ONE_BY_ONE_COLS", case["min_cols"] * 2)
    monkeypatch.setattr(conv_cpu, "ONE_BY_ONE_BYTES", case["block_bytes"])
    monkeypatch.setattr(conv_cpu, "DIRECT_MAX_PAIRS", 0 if case["plan"] == "blocked" else 16)  # grouped, blocked
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = case["k"], case["s"], case["p"], case["d"]
    text = (f"convolution_param {{ num_output: {case['num_output']} group: {case['group']} kernel_h: {kh} "
            f"kernel_w: {kw} stride_h: {sh} stride_w: {sw} pad_h: {ph} pad_w: {pw} dilation: {dh} dilation: {dw} "
            f"bias_term: {str(case['bias']).lower()} {FILL} }}")
    context.set_random_seed(case["seed"] % 1000)
    type_name = "Deconvolution" if case["deconv"] else "Convolution"
    layer = make_layer(type_name, text)
    rng = np.random.default_rng(case["seed"])
    x = rng.normal(size=(case["N"], case["C"]) + case["HW"])
    bottom, top = blobs_from_arrays([x], case["dtype"]), empty_tops(1, case["dtype"])
    layer.SetUp(bottom, top)
    plan = layer.plan(np, case["dtype"])
    layer.Forward(bottom, top)
    top[0].diff[...] = rng.normal(size=top[0].shape)
    for b in layer.blobs:
        b.diff[...] = 0.25  # parameter gradients accumulate
    layer.Backward(top, [True], bottom)
    layer.Backward(top, [True], bottom)  # twice: the second must not reuse a stale buffer
    return plan, [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]


@given(case=layer_cases())
def test_cpu_plans_match_the_batched_path(case):
    _compare_plans(case)


def _compare_plans(case):
    with pytest.MonkeyPatch.context() as mp:
        plan, new = _run_layer(case, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        old_plan, old = _run_layer(case, False, mp)
    assert plan == case["plan"] and old_plan == "batched"
    tol = 1e-11 if case["dtype"] == np.float64 else 1e-4
    for a, b in zip(new, old):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("plan,geometry", [
    ("1x1", dict(k=(1, 1), s=(1, 1), p=(0, 0), d=(1, 1), group=2)),
    ("direct", dict(k=(3, 3), s=(2, 1), p=(1, 1), d=(1, 1), group=3)),
    ("direct", dict(k=(3, 2), s=(1, 1), p=(1, 0), d=(2, 1), group=3)),
    ("direct", dict(k=(1, 3), s=(1, 1), p=(1, 0), d=(1, 1), group=3)),  # pad past the kernel on one axis only
    ("blocked", dict(k=(3, 3), s=(1, 1), p=(1, 1), d=(1, 1), group=1)),    # same padding: im2col's fast copy
    ("blocked", dict(k=(2, 3), s=(2, 1), p=(1, 0), d=(1, 2), group=3)),
])
@pytest.mark.parametrize("deconv", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_bytes,min_cols", [(1 << 20, 256), (200, 4)])  # one block / bands and pieces
def test_every_plan_matches_the_batched_path(plan, geometry, deconv, dtype, block_bytes, min_cols):
    case = dict(plan=plan, deconv=deconv, N=3, C=2 * geometry["group"], num_output=2 * geometry["group"],
                HW=(7, 6), bias=True, dtype=dtype, block_bytes=block_bytes, min_cols=min_cols, seed=17, **geometry)
    _compare_plans(case)


@pytest.mark.parametrize("geometry", [
    dict(k=(3, 3), s=(1, 1), p=(1, 1), d=(1, 1), group=1),
    dict(k=(2, 3), s=(2, 1), p=(1, 0), d=(1, 2), group=3),
    dict(k=(5, 4), s=(1, 2), p=(1, 1), d=(1, 1), group=1),  # kernel_dim 40: float32 past the exact forward
])
@pytest.mark.parametrize("deconv", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_batched_path_without_the_kernels(geometry, deconv, dtype, N, bias):
    """A source tree without the compiled lowering kernels: the batched path's NumPy fallbacks (im2col,
    col2im, the rows/batch layouts, the bias) compute what the kernels do, one image or several."""
    case = dict(plan="blocked", deconv=deconv, N=N, C=2 * geometry["group"], num_output=2 * geometry["group"],
                HW=(7, 6), bias=bias, dtype=dtype, block_bytes=1 << 20, min_cols=256, seed=23, **geometry)
    with pytest.MonkeyPatch.context() as mp:
        plan, ref = _run_layer(case, False, mp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_base, "_k", None)
        plan, got = _run_layer(case, False, mp)
    assert plan == "batched"
    tol = 1e-11 if dtype == np.float64 else 1e-4
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@given(num=st.integers(1, 9), OH=st.integers(1, 20), OW=st.integers(1, 20), rows=st.integers(1, 300),
       itemsize=st.sampled_from([4, 8]), lowered=st.booleans(), block=st.sampled_from([16, 1000, 50000, 1 << 20]),
       min_cols=st.sampled_from([1, 7, 256]))
def test_blocks_cover_every_output_once_in_order(num, OH, OW, rows, itemsize, lowered, block, min_cols):
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("COL_BLOCK_BYTES", block), ("MIN_BLOCK_COLS", min_cols), ("ONE_BY_ONE_BYTES", block),
                            ("ONE_BY_ONE_VIEW_COLS", min_cols), ("ONE_BY_ONE_COLS", 2 * min_cols)):
            mp.setattr(conv_cpu, name, value)
        blocks = conv_cpu.plan_blocks(num, OH, OW, rows, itemsize, lowered)
    seen = []
    for n0, n1, oh0, oh1 in blocks:
        assert 0 <= n0 < n1 <= num and 0 <= oh0 < oh1 <= OH
        assert n1 - n0 == 1 or (oh0, oh1) == (0, OH)  # bands only within one image
        seen += [(n, oh) for n in range(n0, n1) for oh in range(oh0, oh1)]
        cols = (n1 - n0) * (oh1 - oh0) * OW
        if lowered and cols * rows * itemsize > block:  # over budget only where a block is the minimum
            assert n1 - n0 == 1 and ((oh0, oh1) == (0, OH) or oh1 - oh0 <= max(1, -(-min_cols // OW)))
    assert seen == [(n, oh) for n in range(num) for oh in range(OH)]


@pytest.mark.parametrize("text,shape,plan", [
    ("num_output: 6 kernel_size: 1", (2, 4, 5, 3), "1x1"),
    ("num_output: 6 kernel_size: 1 group: 2 dilation: 2", (2, 4, 5, 3), "1x1"),
    ("num_output: 6 kernel_size: 1 stride: 2", (2, 4, 5, 3), "blocked"),
    ("num_output: 6 kernel_size: 1 pad: 1", (2, 4, 5, 3), "blocked"),
    ("num_output: 4 kernel_size: 3 pad: 1 group: 4", (2, 4, 5, 3), "direct"),
    ("num_output: 8 kernel_size: 3 stride: 2 group: 4", (2, 4, 5, 3), "direct"),
    ("num_output: 64 kernel_size: 3 stride: 2 group: 2", (1, 64, 5, 3), "blocked"),  # 32 x 32 per group (stride 1: dense)
    ("num_output: 4 kernel_size: 3 force_nd_im2col: true group: 4", (2, 4, 5, 3), "batched"),
    ("num_output: 4 kernel_size: 3", (2, 4, 5, 3, 3), "batched"),            # 3-D
    ("num_output: 4 kernel_size: 1", (2, 4, 5, 3, 3), "1x1"),                # 3-D 1x1
])
def test_plan_choice(text, shape, plan):
    layer = make_layer("Convolution", f"convolution_param {{ {text} }}")
    bottom, top = blobs_from_arrays([np.zeros(shape)], np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    assert layer.plan(np, np.float32) == plan
    assert layer.plan(np, np.float16) == "batched"


@pytest.mark.parametrize("type_name", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("text", [
    "num_output: 3 kernel_size: 3 stride: 2 pad: 1 group: 3",      # depthwise, MobileNet's stride 2
    "num_output: 6 kernel_size: 2 dilation: 2 group: 3",           # depth multiplier 2
    "num_output: 4 kernel_size: 1 group: 1",                        # 1x1
])
def test_plan_gradients(type_name, text):
    context.set_random_seed(4)
    x = np.random.default_rng(5).normal(size=(2, 3, 4, 5))
    check_layer_gradient(make_layer(type_name, f"convolution_param {{ {text} {FILL} }}"), [x], mode="single")


def test_exact_forward_holds_on_every_plan():
    """float32 output == float64 output rounded, for short dot products, on each CPU plan (the LeNet
    fidelity rule of conv_base.EXACT_FORWARD_MAX_K), with blocks of several images and bands."""
    rng = np.random.default_rng(11)
    for text, shape in (("num_output: 5 kernel_size: 5", (3, 1, 12, 11)),         # blocked (LeNet conv1)
                        ("num_output: 7 kernel_size: 1", (3, 20, 6, 5)),          # 1x1
                        ("num_output: 6 kernel_size: 3 pad: 1 group: 3", (3, 3, 9, 8))):  # direct
        x = rng.normal(size=shape).astype(np.float32)
        outs = []
        for dtype in (np.float32, np.float64):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(conv_cpu, "COL_BLOCK_BYTES", 600)
                mp.setattr(conv_cpu, "MIN_BLOCK_COLS", 8)
                context.set_random_seed(3)
                layer = make_layer("Convolution", f"convolution_param {{ {text} {FILL} }}")
                bottom, top = blobs_from_arrays([x], dtype), empty_tops(1, dtype)
                layer.SetUp(bottom, top)
                assert layer.exact_forward(np.float32)
                for b in layer.blobs:
                    b.data[...] = b.data.astype(np.float32)
                layer.Forward(bottom, top)
                outs.append(top[0].data.copy())
        np.testing.assert_array_equal(outs[0], outs[1].astype(np.float32))
