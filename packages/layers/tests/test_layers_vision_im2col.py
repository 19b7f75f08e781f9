"""Im2col layer and the Cython kernels (im2col/col2im, pooling) against direct NumPy references."""
import importlib

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import LayerError, conv_base, pooling
from caffe.layers import _cpu
from caffe.layers.kernels import lowering as _kernels_im2col, pooling as _kernels_pool

# the lowering builds this CPU runs: the baseline, and lowering_avx512 where the CPU has AVX-512 (conv_cpu loads it)
LOWERING_BUILDS = ["lowering"] + (["lowering_avx512"] if _cpu.cpu_has_avx2() and _cpu.cpu_has_avx512() else [])
from caffe.layers.strategies import random_array
from caffe.layers.testing import check_cpu_gpu_parity, check_layer_gradient, gpu_available, layer_param, \
    make_layer, run_forward


def ref_im2col(x, kernel, stride, pad, dil):
    """Caffe's im2col_nd_cpu by definition: col[c, k..., o...] = x[c, o * s - p + k * d] (0 outside)."""
    N, C = x.shape[:2]
    S = x.shape[2:]
    nd = len(S)
    out = tuple((S[i] + 2 * pad[i] - (dil[i] * (kernel[i] - 1) + 1)) // stride[i] + 1 for i in range(nd))
    col = np.zeros((N, C) + tuple(kernel) + out)
    for n, c in np.ndindex(N, C):
        for kk in np.ndindex(*kernel):
            for o in np.ndindex(*out):
                src = tuple(o[i] * stride[i] - pad[i] + kk[i] * dil[i] for i in range(nd))
                if all(0 <= src[i] < S[i] for i in range(nd)):
                    col[(n, c) + kk + o] = x[(n, c) + src]
    return col.reshape((N, C * int(np.prod(kernel))) + out)


def ref_col2im(col, x_shape, kernel, stride, pad, dil):
    """Caffe's col2im_nd_cpu by definition, the adjoint of ref_im2col: x[n, c, o * s - p + k * d] += col[n, c, k..., o...]
    in float64. col: (N, C * prod(kernel), *out)."""
    N, C = x_shape[:2]
    S = x_shape[2:]
    nd = len(S)
    out = col.shape[2:]
    col = col.reshape((N, C) + tuple(kernel) + tuple(out)).astype(np.float64)
    x = np.zeros(x_shape)
    for n, c in np.ndindex(N, C):
        for kk in np.ndindex(*kernel):
            for o in np.ndindex(*out):
                src = tuple(o[i] * stride[i] - pad[i] + kk[i] * dil[i] for i in range(nd))
                if all(0 <= src[i] < S[i] for i in range(nd)):
                    x[(n, c) + src] += col[(n, c) + kk + o]
    return x


@st.composite
def geometry(draw, max_nd=3):
    nd = draw(st.integers(1, max_nd))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    pad = [draw(st.integers(0, 2)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    sizes = []
    for i in range(nd):
        ext = dil[i] * (kernel[i] - 1) + 1
        lo = max(1, ext - 2 * pad[i])
        sizes.append(draw(st.integers(lo, lo + 5)))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) + tuple(sizes)
    return dict(shape=shape, kernel=kernel, stride=stride, pad=pad, dil=dil, seed=draw(st.integers(0, 2**31 - 1)))


def _text(g, force_nd=False):
    body = "".join(f"kernel_size: {v} " for v in g["kernel"]) + "".join(f"stride: {v} " for v in g["stride"])
    body += "".join(f"pad: {v} " for v in g["pad"]) + "".join(f"dilation: {v} " for v in g["dil"])
    return f"convolution_param {{ {body} force_nd_im2col: {str(force_nd).lower()} }}"


@given(g=geometry(), force_nd=st.booleans())
def test_im2col_layer_matches_definition_and_col2im_is_its_adjoint(g, force_nd):
    x = random_array(g["seed"], g["shape"])
    layer = make_layer("Im2col", _text(g, force_nd))
    bottom, top = run_forward(layer, [x])
    ref = ref_im2col(x, g["kernel"], g["stride"], g["pad"], g["dil"])
    assert top[0].shape == ref.shape
    np.testing.assert_array_equal(top[0].data, ref)
    # backward is the adjoint: <im2col(x), c> == <x, col2im(c)>
    c = random_array(g["seed"] + 1, ref.shape)
    top[0].diff[...] = c
    layer.Backward(top, [True], bottom)
    assert np.vdot(ref, c) == pytest.approx(np.vdot(x, bottom[0].diff), rel=1e-10, abs=1e-10)


@given(g=geometry(max_nd=2).filter(lambda g: np.prod(g["shape"]) <= 24))
def test_im2col_layer_gradient(g):
    x = random_array(g["seed"], g["shape"])
    check_layer_gradient(make_layer("Im2col", _text(g)), [x], mode="single")


def test_im2col_layer_channel_axis_and_errors():
    x = random_array(0, (2, 3, 2, 5, 4))
    layer = make_layer("Im2col", "convolution_param { kernel_size: 2 axis: 2 }")
    _, top = run_forward(layer, [x])
    assert top[0].shape == (2, 3, 8, 4, 3)
    ref = ref_im2col(x.reshape(6, 2, 5, 4), (2, 2), (1, 1), (0, 0), (1, 1))
    np.testing.assert_array_equal(top[0].data.reshape(ref.shape), ref)
    with pytest.raises(LayerError, match=r"Layer 'i' \(Im2col\): .*kernel_h & kernel_w can only be used for 2D"):
        run_forward(make_layer("Im2col", "convolution_param { kernel_h: 2 kernel_w: 2 }", name="i"),
                    [np.ones((1, 1, 3, 3, 3))])
    with pytest.raises(LayerError, match=r"Layer 'i' \(Im2col\): Filter dimensions must be nonzero"):
        run_forward(make_layer("Im2col", "convolution_param { kernel_size: 0 }", name="i"), [np.ones((1, 1, 3, 3))])
    with pytest.raises(LayerError, match=r"Layer 'i' \(Im2col\): Im2col needs at least one spatial axis"):
        run_forward(make_layer("Im2col", "convolution_param { kernel_size: 1 }", name="i"), [np.ones((1, 3))])


# -- the Cython kernels against NumPy references ---------------------------------------------------

@given(g=geometry(max_nd=2).filter(lambda g: len(g["kernel"]) == 2), dtype=st.sampled_from([np.float32, np.float64]),
       layout=st.sampled_from(["batch", "image"]))
def test_cython_im2col_col2im_match_the_generic_path(g, dtype, layout):
    x = random_array(g["seed"], g["shape"]).astype(dtype)
    out = tuple((s + 2 * p - (d * (k - 1) + 1)) // st_ + 1
                for s, k, st_, p, d in zip(g["shape"][2:], g["kernel"], g["stride"], g["pad"], g["dil"]))
    geom = conv_base.ConvGeometry(g["kernel"], g["stride"], g["pad"], g["dil"], g["shape"][2:], out)
    N, C = g["shape"][:2]
    rows, P = C * geom.kernel_count, geom.col_count
    shape = (rows, N * P) if layout == "batch" else (N, rows, P)
    fast, generic = np.full(shape, np.nan, dtype), np.full(shape, np.nan, dtype)
    conv_base.im2col(np, x, fast, geom, layout)
    conv_base.im2col(np, x, generic, geom, layout, force_nd=True)
    np.testing.assert_array_equal(fast, generic)
    ref = ref_im2col(x.astype(np.float64), g["kernel"], g["stride"], g["pad"], g["dil"])  # (N, rows, *out)
    ref = ref.reshape(N, rows, P)
    np.testing.assert_array_equal(fast, ref.transpose(1, 0, 2).reshape(shape) if layout == "batch" else ref)
    c = random_array(g["seed"] + 2, shape).astype(dtype)
    back_fast, back_generic = np.full(x.shape, np.nan, dtype), np.full(x.shape, np.nan, dtype)
    conv_base.col2im(np, c, back_fast, geom, layout)
    conv_base.col2im(np, c, back_generic, geom, layout, force_nd=True)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(back_fast, back_generic, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,kernel,stride,pad,dil", [
    ((8, 16, 20, 19), (3, 3), (1, 1), (1, 1), (1, 1)),   # parallel branch (work above PARALLEL_MIN_WORK)
    ((5, 3, 33, 31), (5, 4), (2, 3), (2, 1), (2, 1)),
    ((64, 1, 28, 28), (5, 5), (1, 1), (0, 0), (1, 1)),   # LeNet conv1: one channel, image blocks
])
@pytest.mark.parametrize("layout", ["batch", "image"])
def test_cython_im2col_col2im_parallel_shapes(shape, kernel, stride, pad, dil, layout):
    x = random_array(1, shape).astype(np.float32)
    out = tuple((s + 2 * p - (d * (k - 1) + 1)) // st_ + 1
                for s, k, st_, p, d in zip(shape[2:], kernel, stride, pad, dil))
    geom = conv_base.ConvGeometry(kernel, stride, pad, dil, shape[2:], out)
    N, C = shape[:2]
    rows, P = C * geom.kernel_count, geom.col_count
    cshape = (rows, N * P) if layout == "batch" else (N, rows, P)
    fast, generic = np.empty(cshape, np.float32), np.empty(cshape, np.float32)
    conv_base.im2col(np, x, fast, geom, layout)
    conv_base.im2col(np, x, generic, geom, layout, force_nd=True)
    np.testing.assert_array_equal(fast, generic)
    back_fast, back_generic = np.empty_like(x), np.empty_like(x)
    conv_base.col2im(np, fast, back_fast, geom, layout)
    conv_base.col2im(np, fast, back_generic, geom, layout, force_nd=True)
    np.testing.assert_allclose(back_fast, back_generic, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build", LOWERING_BUILDS)
@given(g=geometry(max_nd=2).filter(lambda g: len(g["kernel"]) == 2), dtype=st.sampled_from([np.float32, np.float64]),
       data=st.data())
def test_cython_lowering_of_a_block_of_output_rows(build, g, dtype, data):
    """im2col_2d / col2im_2d on a band of output rows (convolution's cache blocks) against the full lowering and
    (im2col) the definition."""
    _kernels_im2col = importlib.import_module(f"caffe.layers.kernels.{build}")
    x = random_array(g["seed"], g["shape"]).astype(dtype)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g["kernel"], g["stride"], g["pad"], g["dil"]
    N, C, H, W = g["shape"]
    OH, OW = ((s + 2 * p - (d * (k - 1) + 1)) // st_ + 1
              for s, k, st_, p, d in zip(g["shape"][2:], g["kernel"], g["stride"], g["pad"], g["dil"]))
    oh0 = data.draw(st.integers(0, OH - 1))
    oh1 = data.draw(st.integers(oh0 + 1, OH))
    rows, P, Pb = C * kh * kw, OH * OW, (oh1 - oh0) * OW
    geo = (N, C, H, W, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
    full = np.empty((rows, N * P), dtype)
    _kernels_im2col.im2col_2d(x.ravel(), full.ravel(), *geo, N * P, P)
    block = np.full((rows, N * Pb), np.nan, dtype)
    _kernels_im2col.im2col_2d(x.ravel(), block.ravel(), *geo, N * Pb, Pb, oh0, oh1)
    ref = ref_im2col(x.astype(np.float64), g["kernel"], g["stride"], g["pad"], g["dil"]).reshape(N, rows, P)
    np.testing.assert_array_equal(full, ref.transpose(1, 0, 2).reshape(rows, N * P))
    expect = full.reshape(rows, N, P)[:, :, oh0 * OW:oh1 * OW].reshape(rows, N * Pb)
    np.testing.assert_array_equal(block, expect)
    if dtype == np.float32:  # the exact short-K forward lowers straight into float64
        wide = np.empty((rows, N * Pb), np.float64)
        _kernels_im2col.im2col_2d_f64(x.ravel(), wide.ravel(), *geo, N * Pb, Pb, oh0, oh1)
        np.testing.assert_array_equal(wide, expect.astype(np.float64))
    c = random_array(g["seed"] + 3, (rows, N * Pb)).astype(dtype)
    cfull = c.reshape(rows, N, Pb).transpose(1, 0, 2).reshape(N, rows, oh1 - oh0, OW)  # the band, zero elsewhere
    cfull = np.concatenate([np.zeros((N, rows, oh0, OW), dtype), cfull, np.zeros((N, rows, OH - oh1, OW), dtype)], 2)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    definition = ref_col2im(cfull, x.shape, g["kernel"], g["stride"], g["pad"], g["dil"])
    start = random_array(g["seed"] + 4, x.shape).astype(dtype)
    im = start.copy()
    _kernels_im2col.col2im_2d(c.ravel(), im.ravel(), *geo, N * Pb, Pb, oh0, oh1, True)
    padded = np.zeros((rows, N, P), dtype)  # the band's columns in a full buffer, zero elsewhere
    padded[:, :, oh0 * OW:oh1 * OW] = c.reshape(rows, N, Pb)
    ref = np.empty_like(x)
    _kernels_im2col.col2im_2d(padded.ravel(), ref.ravel(), *geo, N * P, P)
    np.testing.assert_allclose(ref, definition, rtol=tol, atol=tol)
    np.testing.assert_allclose(im, start + ref, rtol=tol, atol=tol)
    over = start.copy()
    _kernels_im2col.col2im_2d(c.ravel(), over.ravel(), *geo, N * Pb, Pb, oh0, oh1)  # overwrite
    np.testing.assert_allclose(over, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("build", LOWERING_BUILDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cython_lowering_of_every_row_length(build, dtype):
    """Rows of 1 to 40 positions (the kernels copy and add rows in vectors of 16 / 8 / 4 / 2 and a masked or scalar
    end): im2col, its float64 widening and col2im against the definitions, at stride 1 with a column pad (rows that
    start inside a row) and at stride 2."""
    mod = importlib.import_module(f"caffe.layers.kernels.{build}")
    for W in range(1, 41):
        for (kh, kw), (sh, sw), (ph, pw) in (((2, 3), (1, 1), (0, 1)), ((1, 2), (2, 1), (0, 0)), ((2, 1), (1, 2), (1, 0))):
            if W + 2 * pw < kw:
                continue
            N, C, H = 2, 2, 3
            OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
            x = random_array(W, (N, C, H, W)).astype(dtype)
            rows, P = C * kh * kw, OH * OW
            geo = (N, C, H, W, kh, kw, ph, pw, sh, sw, 1, 1, OH, OW, N * P, P)
            col = np.full((rows, N * P), np.nan, dtype)
            mod.im2col_2d(x.ravel(), col.ravel(), *geo)
            ref = ref_im2col(x.astype(np.float64), (kh, kw), (sh, sw), (ph, pw), (1, 1)).reshape(N, rows, P)
            np.testing.assert_array_equal(col, ref.transpose(1, 0, 2).reshape(rows, N * P))
            if dtype == np.float32:
                wide = np.full((rows, N * P), np.nan)
                mod.im2col_2d_f64(x.ravel(), wide.ravel(), *geo)
                np.testing.assert_array_equal(wide, col.astype(np.float64))
            c = random_array(W + 1, (rows, N * P)).astype(dtype)
            back = np.full(x.shape, np.nan, dtype)
            mod.col2im_2d(c.ravel(), back.ravel(), *geo)
            definition = ref_col2im(c.reshape(rows, N, OH, OW).transpose(1, 0, 2, 3), x.shape, (kh, kw), (sh, sw),
                                    (ph, pw), (1, 1))
            tol = 1e-12 if dtype == np.float64 else 1e-5
            np.testing.assert_allclose(back, definition, rtol=tol, atol=tol)


@pytest.mark.parametrize("build", LOWERING_BUILDS)
def test_cython_lowering_writes_nothing_past_its_band(build):
    """A band of output rows that ends inside the top padding (a 'same'-width layer with more padding rows than the
    band has: all of it zero) writes only its band: the lowering once zeroed up to the first row that reads the
    image, past the band and the buffer (found by the block property's long profile as heap corruption)."""
    mod = importlib.import_module(f"caffe.layers.kernels.{build}")
    guard = 256
    for dtype in (np.float32, np.float64):
        for (H, W, kh, kw, ph, pw, dh), (oh0, oh1) in (((3, 5, 1, 1, 2, 0, 1), (0, 1)), ((3, 6, 3, 3, 3, 1, 1), (0, 2)),
                                                      ((1, 4, 3, 1, 2, 0, 2), (0, 1)), ((2, 7, 2, 3, 3, 1, 1), (1, 2))):
            N, C = 2, 2
            OH, OW = H + 2 * ph - dh * (kh - 1), W + 2 * pw - (kw - 1)
            rows, Pb = C * kh * kw, (oh1 - oh0) * OW
            x = random_array(H * W, (N, C, H, W)).astype(dtype)
            for rs, ns in ((N * Pb, Pb), (Pb, rows * Pb)):  # the batch and the image layouts
                buf = np.full(rows * N * Pb + 2 * guard, 7.0, dtype)
                mod.im2col_2d(x.ravel(), buf[guard:-guard], N, C, H, W, kh, kw, ph, pw, 1, 1, dh, 1, OH, OW, rs, ns,
                              oh0, oh1)
                assert (buf[:guard] == 7).all() and (buf[-guard:] == 7).all(), (H, W, kh, kw, ph, pw, oh0, oh1)
                full = ref_im2col(x.astype(np.float64), (kh, kw), (1, 1), (ph, pw), (dh, 1)).reshape(N, rows, OH, OW)
                band = full[:, :, oh0:oh1].reshape(N, rows, Pb)
                want = band.transpose(1, 0, 2).reshape(-1) if rs == N * Pb else band.reshape(-1)
                np.testing.assert_array_equal(buf[guard:-guard], want)


@given(nb=st.integers(1, 4), C=st.integers(1, 5), P=st.integers(1, 40), data=st.data(), bias=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_cython_layout_changes_of_a_block_of_positions(nb, C, P, data, bias, dtype):
    p0 = data.draw(st.integers(0, P - 1))
    Pb = data.draw(st.integers(1, P - p0))
    rng = np.random.default_rng(nb * 1000 + C * 100 + P)
    batch = rng.normal(size=(nb, C, P)).astype(dtype)
    rows = np.full((C, nb * Pb), np.nan, dtype)
    _kernels_im2col.batch_to_rows(batch.ravel(), rows.ravel(), nb, C, P, p0, Pb)
    np.testing.assert_array_equal(rows, batch[:, :, p0:p0 + Pb].transpose(1, 0, 2).reshape(C, nb * Pb))
    b = rng.normal(size=C).astype(dtype) if bias else None
    out = batch.copy()
    _kernels_im2col.rows_to_batch(rows.ravel(), out.ravel(), b, nb, C, P, p0, Pb)
    np.testing.assert_array_equal(out[:, :, :p0], batch[:, :, :p0])  # outside the block: untouched
    np.testing.assert_array_equal(out[:, :, p0 + Pb:], batch[:, :, p0 + Pb:])
    expect = batch[:, :, p0:p0 + Pb] + (b.reshape(1, C, 1) if bias else 0)
    np.testing.assert_array_equal(out[:, :, p0:p0 + Pb], expect)
    if dtype == np.float32:  # the exact forward's conversions: widen, then round float64 sums once
        wide = np.empty((C, nb * Pb), np.float64)
        _kernels_im2col.batch_to_rows_f64(batch.ravel(), wide.ravel(), nb, C, P, p0, Pb)
        np.testing.assert_array_equal(wide, rows.astype(np.float64))
        sums = wide + rng.normal(size=wide.shape) * 1e-9
        b64 = rng.normal(size=C) if bias else None
        out32 = batch.copy()
        _kernels_im2col.rows_to_batch_f32(sums.ravel(), out32.ravel(), b64, nb, C, P, p0, Pb)
        ref = sums.reshape(C, nb, Pb).transpose(1, 0, 2) + (b64.reshape(1, C, 1) if bias else 0)
        np.testing.assert_array_equal(out32[:, :, p0:p0 + Pb], ref.astype(np.float32))


def test_kernels_refuse_mixed_dtypes_and_short_buffers():
    x = np.zeros(2 * 3 * 4 * 4, np.float32)
    with pytest.raises((TypeError, ValueError), match="dtype mismatch|No matching signature"):
        _kernels_im2col.im2col_2d(x, np.zeros(10, np.float64), 2, 3, 4, 4, 2, 2, 0, 0, 1, 1, 1, 1, 3, 3, 18, 9)
    with pytest.raises(ValueError, match="column buffer too small"):
        _kernels_im2col.im2col_2d(x, np.zeros(10, np.float32), 2, 3, 4, 4, 2, 2, 0, 0, 1, 1, 1, 1, 3, 3, 18, 9)
    with pytest.raises(ValueError, match="image buffer too small"):
        _kernels_im2col.col2im_2d(np.zeros(12 * 18, np.float32), np.zeros(5, np.float32), 2, 3, 4, 4, 2, 2, 0, 0,
                                  1, 1, 1, 1, 3, 3, 18, 9)
    with pytest.raises(ValueError, match="bad output row range"):
        _kernels_im2col.im2col_2d(x, np.zeros(400, np.float32), 2, 3, 4, 4, 2, 2, 0, 0, 1, 1, 1, 1, 3, 3, 18, 9, 2, 4)
    with pytest.raises((TypeError, ValueError), match="dtype mismatch|No matching signature"):
        _kernels_im2col.im2col_2d_f64(x.astype(np.float64), np.zeros(400), 2, 3, 4, 4, 2, 2, 0, 0, 1, 1, 1, 1, 3, 3,
                                      18, 9)
    with pytest.raises(ValueError, match="bad position block"):
        _kernels_im2col.batch_to_rows(x, np.zeros(96, np.float32), 2, 3, 16, 10, 7)
    with pytest.raises(ValueError, match="top buffer holds"):
        _kernels_pool.ave_pool_forward(x, np.zeros(3, np.float32), 6, 4, 4, 2, 2, 2, 2, 2, 2, 0, 0)


@given(n=st.integers(1, 70), c=st.integers(1, 40), side=st.integers(2, 9), dtype=st.sampled_from([np.float32, np.float64]))
def test_cython_pooling_threads_agree_with_the_generic_path(n, c, side, dtype):
    # big enough for the parallel branch (PARALLEL_MIN_WORK) in some examples
    x = np.random.default_rng(n * 100 + c).normal(size=(n, c, side, side)).astype(dtype)
    spec = pooling.PoolSpec(pooling.MAX, (3, 3), (2, 2), (1, 1))
    PH = pooling.pooled_size(side, 3, 2, 1)
    outs = []
    for kernels in (pooling._k, None):
        saved, pooling._k = pooling._k, kernels
        try:
            y, m = np.empty((n, c, PH, PH), dtype), np.empty((n, c, PH, PH), np.int32)
            pooling.max_forward(np, spec, x, y, m)
            dx = np.empty_like(x)
            pooling.max_backward(np, spec, y, m, dx)
            ya = np.empty_like(y)
            pooling.ave_forward(np, pooling.PoolSpec(pooling.AVE, (3, 3), (2, 2), (1, 1)), x, ya)
            outs.append((y, m, dx, ya))
        finally:
            pooling._k = saved
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no GPU (CuPy with a CUDA device) available")
def test_cpu_gpu_parity():
    x = np.random.default_rng(0).normal(size=(2, 3, 6, 5))
    check_cpu_gpu_parity(layer_param("Im2col", "convolution_param { kernel_size: 3 stride: 2 pad: 1 }"), [x])
