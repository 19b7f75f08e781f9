"""The AVX2 builds of the kernels (elementwise_avx2, softmax_avx2, normalization_avx2, pooling_avx2) and the
AVX-512 ones (elementwise_avx512, softmax_avx512, lowering_avx512, ...) against the baseline builds: the same source, so the same
results up to libm's ulps (bit for bit elsewhere); and which build the layers load."""
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import _cpu

SEEDS = st.integers(0, 2**31 - 1)
DTYPES = st.sampled_from([np.float32, np.float64])


def _pair(name, build="avx2"):
    if not _cpu.cpu_has_avx2():
        pytest.skip("this CPU has no AVX2: only the baseline builds run here")
    if build == "avx512" and not _cpu.cpu_has_avx512():
        pytest.skip(f"this CPU lacks AVX-512 ({', '.join(_cpu.AVX512_FEATURES)}): {name}_avx512 cannot run here")
    try:
        return importlib.import_module(f"caffe.layers.kernels.{name}"), \
            importlib.import_module(f"caffe.layers.kernels.{name}_{build}")
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"kernel build missing: {e}")


def _close(a, b, dtype, exact, scale=1.0):
    """scale: the magnitude of the terms a result was summed from, where it can cancel below them (softmax's
    backward: dy - sum(dy y))."""
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        r = 4e-7 if dtype == np.float32 else 2e-15  # a few ulps
        np.testing.assert_allclose(a, b, rtol=r, atol=r * max(1.0, scale, float(np.abs(b).max(initial=0))))


# (op, a, b, c, d, input range, libm involved)
OPS = [(0, 0.1, 0, 0, 0, (-2, 2), False), (1, 0, 0, 0, 0, (-8, 8), True), (2, 0, 0, 0, 0, (-4, 4), True),
       (3, 0.7, 0, 0, 0, (-3, 2), True), (4, 0.5, 1.5, 1.7, 0.85, (-2, 2), True),
       (4, 0.5, 1.0, 2.0, 1.0, (-2, 2), False), (5, 0.5, 1.2, 0, 0, (-3, 3), True),
       (6, 2.0, 5.0, 0.4, 0.8, (-2, 2), True), (7, 0, 0, 0, 0, (-2, 2), False), (8, 0, 0, 0, 0, (-60, 60), True),
       (9, 0.3, 0, 0, 0, (-2, 2), False), (10, -0.5, 0.8, 0, 0, (-2, 2), False), (11, 1.3, 0, 0, 0, (-4, 4), True),
       (12, 1.5, -0.5, 0, 0, (-2, 2), False)]


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@pytest.mark.parametrize("op, a, b, c, d, bounds, libm", OPS, ids=[str(o[0]) + "-" + str(i) for i, o in enumerate(OPS)])
@given(n=st.sampled_from([1, 7, 4096, 4103, 40000]), dtype=DTYPES, seed=SEEDS)
def test_neuron_builds_agree(build, op, a, b, c, d, bounds, libm, n, dtype, seed):
    base, avx = _pair("elementwise", build)
    rng = np.random.default_rng(seed)
    x = rng.uniform(*bounds, n).astype(dtype)
    dy = rng.uniform(-1, 1, n).astype(dtype)
    e = np.empty(0, dtype)
    outs = []
    for mod in (base, avx):
        y, aux, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        mod.neuron_forward(op, x, y, aux if op == 11 else e, e, a, b, c)
        if op != 9:
            mod.neuron_backward(op, x, y, aux if op == 11 else e, dy, dx, a, b, c, d)
        outs.append((y, dx if op != 9 else y))
    _close(outs[1][0], outs[0][0], dtype, not libm)
    _close(outs[1][1], outs[0][1], dtype, not libm)


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(shape=st.sampled_from([(3, 7, 5), (2, 1000, 1), (2, 33, 300)]), dtype=DTYPES, seed=SEEDS)
def test_softmax_builds_agree(build, shape, dtype, seed):
    if not _cpu.cpu_has_avx2("FMA3"):
        pytest.skip(f"softmax_{build} is built with FMA: this CPU has none")
    base, avx = _pair("softmax", build)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 5).astype(dtype).ravel()
    dy = rng.standard_normal(x.size).astype(dtype)
    res = []
    for mod in (base, avx):
        y, dx = np.empty_like(x), np.empty_like(x)
        mod.softmax_forward(x, y, *shape)
        mod.softmax_backward(y, dy, dx, *shape)
        res.append((y, dx))
    # (dx = (dy - sum(dy y)) y cancels: its error is the sum's, a few ulps of max|dy| (seed 1657508 at (2, 33, 300):
    # 4.7e-7 at dx = -0.044, with max|dy| 3.9, against an atol of 4e-7 of max|dx|)
    _close(res[1][0], res[0][0], dtype, False)
    _close(res[1][1], res[0][1], dtype, False, scale=float(np.abs(dy).max()))


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(shape=st.sampled_from([(3, 4, 5), (2, 7, 3001), (1, 2, 9)]), dtype=DTYPES, seed=SEEDS)
def test_normalization_builds_agree(build, shape, dtype, seed):
    base, avx = _pair("normalization", build)
    rng = np.random.default_rng(seed)
    n, c, s = shape
    x = (rng.standard_normal(n * c * s) + 3).astype(dtype)
    dy = rng.standard_normal(x.size).astype(dtype)
    e = np.empty(0, dtype)
    res = []
    for mod in (base, avx):
        y, dx, m, v = np.empty_like(x), np.empty_like(x), np.zeros(c), np.zeros(c)
        mod.batch_norm_train_forward(x, y, e, m, v, n, c, s, 1e-5)
        inv = (1 / np.sqrt(v + 1e-5)).astype(dtype)
        mod.batch_norm_train_backward(dy, e, x, m.astype(dtype), inv, dx, n, c, s)
        sc, yl, dxl = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        mod.lrn_across_forward(x, yl, sc, n, c, s, 3, 0.5, 1.0, 0.6)
        mod.lrn_across_backward(x, yl, sc, dy, dxl, n, c, s, 3, 0.5, 0.6)
        dxr = np.empty_like(x)
        mod.lrn_across_backward(x, yl, None, dy, dxr, n, c, s, 3, 0.5, 0.6, k=1.0)  # the scale recomputed
        res.append((m, v, y, dx, sc, yl, dxl, dxr))
    for g, e_ in zip(res[1], res[0]):
        _close(g, e_, dtype, False)


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(hw=st.sampled_from([(7, 7), (13, 17), (56, 56), (40, 70)]), k=st.sampled_from([2, 3]),
       s=st.sampled_from([1, 2, 3]), pad=st.sampled_from([0, 1]), dtype=DTYPES, seed=SEEDS)
def test_pooling_builds_agree_bit_for_bit(build, hw, k, s, pad, dtype, seed):
    base, avx = _pair("pooling", build)
    from caffe.layers.pooling import pooled_size
    H, W = hw
    pad = min(pad, k - 1)
    PH, PW = pooled_size(H, k, s, pad), pooled_size(W, k, s, pad)
    planes = 3
    x = np.random.default_rng(seed).integers(-3, 4, planes * H * W).astype(dtype)  # ties on purpose
    dy = np.random.default_rng(seed + 1).standard_normal(planes * PH * PW).astype(dtype)
    res = []
    for mod in (base, avx):
        y, m = np.empty(planes * PH * PW, dtype), np.empty(planes * PH * PW, np.int32)
        ya, dx, dxa = np.empty_like(y), np.empty_like(x), np.empty_like(x)
        mod.max_pool_forward(x, y, m, planes, H, W, PH, PW, k, k, s, s, pad, pad)
        yv = np.empty_like(y)  # the values alone (a TEST-phase forward): max_pool_forward's, bit for bit
        mod.max_pool_forward(x, yv, None, planes, H, W, PH, PW, k, k, s, s, pad, pad)
        np.testing.assert_array_equal(yv.view(np.uint8), y.view(np.uint8))
        mod.max_pool_backward(dy, m, dx, planes, H * W, PH * PW)
        mod.ave_pool_forward(x, ya, planes, H, W, PH, PW, k, k, s, s, pad, pad)
        mod.ave_pool_backward(dy, dxa, planes, H, W, PH, PW, k, k, s, s, pad, pad)
        res.append((y, m, dx, ya, dxa))
    for g, e in zip(res[1], res[0]):
        np.testing.assert_array_equal(g, e)


@given(data=st.data(), dtype=DTYPES, seed=SEEDS, layout=st.sampled_from(["batch", "image"]))
def test_lowering_builds_agree_bit_for_bit(data, dtype, seed, layout):
    """lowering_avx512 against the baseline lowering: im2col (into float32 / float64, and float32 widened), col2im
    (overwriting, accumulating), over bands of output rows, with rows of 1 to ~90 (the vectors of 16 and 8, the
    masked end, the stride-2 and stride-4 permutes) and every stride, pad and dilation the kernels take: the same
    bits (copies and single adds)."""
    base, avx = _pair("lowering", "avx512")
    draw = data.draw
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw, dh, dw = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    H = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 20))
    W = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 90))
    N, C = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    OH, OW = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    oh0 = draw(st.integers(0, OH - 1))
    oh1 = draw(st.integers(oh0 + 1, OH))
    rows, Pb = C * kh * kw, (oh1 - oh0) * OW
    rs, ns = (N * Pb, Pb) if layout == "batch" else (Pb, rows * Pb)
    geo = (N, C, H, W, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, rs, ns, oh0, oh1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(N * C * H * W).astype(dtype)
    c = rng.standard_normal(rows * N * Pb).astype(dtype)
    start = rng.standard_normal(x.size).astype(dtype)
    res = []
    for mod in (base, avx):
        col = np.full(rows * N * Pb, np.nan, dtype)
        mod.im2col_2d(x, col, *geo)
        wide = np.full(col.size, np.nan)
        if dtype == np.float32:
            mod.im2col_2d_f64(x, wide, *geo)
        over, acc = np.full(x.size, np.nan, dtype), start.copy()
        mod.col2im_2d(c, over, *geo)
        mod.col2im_2d(c, acc, *geo, True)
        res.append((col, wide, over, acc))
    for g, e in zip(res[1], res[0]):
        np.testing.assert_array_equal(g.view(np.uint8), e.view(np.uint8))


def _before_a_guard_page(n):
    """A float32 array of n whose last element ends where a PROT_NONE page begins (a read past it faults), and
    the mapping that holds it (keep it alive)."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    size = -(-n * 4 // page) * page
    buf = mmap.mmap(-1, size + page)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(ctypes.c_void_p(addr + size), page, 0) != 0:  # pragma: no cover
        pytest.skip("mprotect failed: no guard page")
    arr = np.frombuffer(buf, np.float32, count=n, offset=size - n * 4)
    return arr, buf, (libc, addr, size, page)


@pytest.mark.parametrize("pw", [0, 1, 2, 5])
def test_lowering_stride4_rows_every_width(pw):
    """im2col's stride-4 rows (AlexNet's conv1: 11 x 11, stride 4) of every output width from 1 to 40, against
    the baseline build's scalar loop, with the image's last row ending at a page no one may read (the permutes'
    fourth load is masked to the row: a read past it would crash the test)."""
    import ctypes
    base, avx = _pair("lowering", "avx512")
    for kw in (1, 3, 11):
        for OW in range(1, 41):
            W = (OW - 1) * 4 + kw - 2 * pw
            if W < 1:
                continue
            N, C, H, kh, ph = 2, 2, 3, 1, 0
            geo = (N, C, H, W, kh, kw, ph, pw, 1, 4, 1, 1, H, OW, N * H * OW, H * OW, 0, H)
            x, buf, (libc, addr, size, page) = _before_a_guard_page(N * C * H * W)
            x[...] = np.random.default_rng(OW).standard_normal(x.size).astype(np.float32)
            res = []
            for mod in (base, avx):
                col = np.full(C * kh * kw * N * H * OW, np.nan, np.float32)
                mod.im2col_2d(x, col, *geo)
                res.append(col)
            libc.mprotect(ctypes.c_void_p(addr + size), page, 3)  # readable again before the mapping goes
            del x
            assert not np.isnan(res[0]).any()
            np.testing.assert_array_equal(res[1].view(np.uint32), res[0].view(np.uint32), err_msg=f"OW {OW} kw {kw}")


@given(shape=st.sampled_from([(3, 7, 5), (2, 1000, 1), (2, 33, 300), (2, 21, 4099), (1, 64, 3 * 1024 + 5)]), seed=SEEDS,
       stream=st.booleans())
def test_softmax_avx512_float32_is_the_avx2_bits(shape, seed, stream):
    """float32 softmax: the AVX-512 build is the AVX2 one 16 lanes wide (the same FMA exp, IEEE divisions, sums
    over channels per position in the same order), so the probabilities and gradients are the same bits; the
    loss (libmvec's AVX2 logf per position in both builds, or libm's logf where inner is 1) is summed per piece,
    and the AVX-512 build's pieces are half as large: the same up to the grouping of a double sum."""
    avx2, avx512 = _pair("softmax", "avx2")[1], _pair("softmax", "avx512")[1]
    rng = np.random.default_rng(seed)
    outer, c, inner = shape
    x = (rng.standard_normal(outer * c * inner) * 5).astype(np.float32)
    dy = rng.standard_normal(x.size).astype(np.float32)
    lab = rng.integers(0, c, outer * inner).astype(np.int64)
    val = (rng.random(outer * inner) > 0.2).astype(np.uint8)
    res = []
    for mod in (avx2, avx512):
        old = mod._set_stream_min_bytes(0 if stream else 1 << 62)
        try:
            y, dx, p = np.empty_like(x), np.empty_like(x), np.empty_like(x)
            mod.softmax_forward(x, y, *shape)
            mod.softmax_backward(y, dy, dx, *shape)
            loss = mod.softmax_loss_forward(x, p, lab, val, *shape)
        finally:
            mod._set_stream_min_bytes(*old)
        res.append((y, dx, p, loss))
    for g, e in zip(res[1][:3], res[0][:3]):
        np.testing.assert_array_equal(g, e)
    assert res[1][3] == pytest.approx(res[0][3], rel=1e-13)


@given(shape=st.sampled_from([(3, 4, 5), (2, 7, 3001), (1, 2, 9), (2, 33, 300)]), dtype=DTYPES, seed=SEEDS,
       size=st.sampled_from([1, 3, 5]), stream=st.booleans())
def test_normalization_avx512_is_the_avx2_bits(shape, dtype, seed, size, stream):
    """BatchNorm's sums are GCC vector-extension code (the same lanes added in the same order under every build),
    its normalization and LRN's (beta 0.75: two square roots and a division) are IEEE operations without FMA
    contraction, so the AVX-512 build gives the AVX2 build's bits: statistics, tops, x_norm (streamed or not),
    scale and gradients (LRN's with the scale read or recomputed). (Other betas call libmvec's pow: within its
    ulps, test_normalization_builds_agree.)"""
    avx2, avx512 = _pair("normalization", "avx2")[1], _pair("normalization", "avx512")[1]
    rng = np.random.default_rng(seed)
    n, c, s = shape
    x = (rng.standard_normal(n * c * s) * 3 + 2).astype(dtype)
    dy = rng.standard_normal(x.size).astype(dtype)
    e = np.empty(0, dtype)
    res = []
    for mod in (avx2, avx512):
        y, xn, dx, dx2 = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty_like(x)
        m, v = np.zeros(c), np.zeros(c)
        mod.batch_norm_train_forward(x, y, xn if stream else e, m, v, n, c, s, 1e-5)
        inv = (1 / np.sqrt(v + 1e-5)).astype(dtype)
        mod.batch_norm_train_backward(dy, e, x, m.astype(dtype), inv, dx, n, c, s)
        if stream:
            mod.batch_norm_train_backward(dy, xn, e, m.astype(dtype), inv, dx2, n, c, s)
        sc, yl, yv, dxl = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty_like(x)
        mod.lrn_across_forward(x, yl, sc, n, c, s, size, 0.5, 1.0, 0.75)
        mod.lrn_across_forward(x, yv, None, n, c, s, size, 0.5, 1.0, 0.75)
        mod.lrn_across_backward(x, yl, sc, dy, dxl, n, c, s, size, 0.5, 0.75)
        dxr = np.empty_like(x)
        mod.lrn_across_backward(x, yl, None, dy, dxr, n, c, s, size, 0.5, 0.75, k=1.0)  # the scale recomputed
        res.append((m, v, y, dx, sc, yl, yv, dxl, dxr) + ((xn, dx2) if stream else ()))
    for g, e_ in zip(res[1], res[0]):
        np.testing.assert_array_equal(g, e_)


def _expected_builds():
    """What _cpu should have loaded for elementwise / softmax under this process's environment."""
    if not _cpu.USE_AVX2:
        return ""
    return "_avx512" if _cpu.USE_AVX512 else "_avx2"


def test_the_layers_load_the_avx512_builds_where_the_cpu_has_avx512():
    """USE_AVX512 is the CPU check (F, DQ, VL, BW, as NumPy's dispatch sees them) unless switched off, and the
    layers' kernels are then the AVX-512 builds (elementwise, softmax, normalization, pooling, channelwise, rng)."""
    off = os.environ.get("CAFFE_KERNELS_AVX512", "1") == "0" or os.environ.get("CAFFE_KERNELS_AVX2", "1") == "0"
    assert _cpu.USE_AVX512 == (_cpu.cpu_has_avx512() and _cpu.cpu_has_avx2() and not off)
    if not _cpu.cpu_has_avx512():
        pytest.skip(f"this CPU lacks AVX-512 ({', '.join(_cpu.AVX512_FEATURES)}): the AVX2 builds are loaded")
    if off:
        pytest.skip("CAFFE_KERNELS_AVX512=0 / CAFFE_KERNELS_AVX2=0 in this environment")
    assert _cpu.elementwise.__name__ == "caffe.layers.kernels.elementwise_avx512"
    assert _cpu.softmax.__name__ == "caffe.layers.kernels.softmax_avx512"
    assert _cpu.normalization.__name__ == "caffe.layers.kernels.normalization_avx512"
    from caffe.layers import pooling
    assert pooling._k.__name__ == "caffe.layers.kernels.pooling_avx512"
    assert _cpu.channelwise.__name__ == "caffe.layers.kernels.channelwise_avx512"
    assert _cpu.rng.__name__ == "caffe.layers.kernels.rng_avx512"
    from caffe.layers import conv_base, conv_cpu
    assert conv_cpu._k.__name__ == conv_base._k.__name__ == "caffe.layers.kernels.lowering_avx512"


@pytest.mark.parametrize("env, suffix", [({"CAFFE_KERNELS_AVX512": "0"}, "_avx2"), ({"CAFFE_KERNELS_AVX2": "0"}, ""),
                                         ({"CAFFE_KERNELS_AVX512": "1"}, None)])
def test_the_switches_choose_the_builds(env, suffix):
    """CAFFE_KERNELS_AVX512=0 keeps the AVX2 builds (and the dense convolution's AVX2 variant), CAFFE_KERNELS_AVX2=0
    the baseline ones (for AVX-512 too), by default the widest build this CPU runs, for every family with builds:
    elementwise, softmax, channelwise, normalization, pooling (a fresh process: the choice is made at import)."""
    widest = "_avx512" if _cpu.cpu_has_avx512() else "_avx2"
    if suffix is None:
        suffix = widest
    if suffix and not (_cpu.cpu_has_avx2() and _cpu.cpu_has_avx2("FMA3")):
        suffix = ""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CAFFE_KERNELS_", "CAFFE_CONV_DENSE"))}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", "from caffe.layers import _cpu, pooling, conv_cpu; "
                          "from caffe.layers.kernels import conv_direct_avx2 as cd; "
                          "print(_cpu.elementwise.__name__, _cpu.softmax.__name__, _cpu.channelwise.__name__, "
                          "_cpu.normalization.__name__, pooling._k.__name__, conv_cpu._k.__name__, cd.AVX512)"],
                         env=full, capture_output=True, text=True, check=True).stdout.split()
    # (channelwise and lowering have no AVX2 build: the baseline ones unless AVX-512)
    wide_only = "_avx512" if suffix == "_avx512" else ""
    assert out == [f"caffe.layers.kernels.elementwise{suffix}", f"caffe.layers.kernels.softmax{suffix}",
                   f"caffe.layers.kernels.channelwise{wide_only}",
                   f"caffe.layers.kernels.normalization{suffix}", f"caffe.layers.kernels.pooling{suffix}",
                   f"caffe.layers.kernels.lowering{wide_only}",
                   str(widest == "_avx512" and env.get("CAFFE_KERNELS_AVX512") != "0")]


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(n=st.sampled_from([1, 15, 17, 4096, 4103, 40000]), dtype=DTYPES, seed=SEEDS, in_place=st.booleans())
def test_eltwise_max_backward_builds_agree_bit_for_bit(build, n, dtype, seed, in_place):
    """Eltwise MAX backward with two bottoms (the AVX-512 build ANDs dy's bits with the mask's words, the others
    select): the same bits as the baseline build, NaN and -0 in dy passed where chosen, +0 elsewhere; also with a
    bottom diff that is the top diff (in place)."""
    base, avx = _pair("elementwise", build)
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal(n).astype(dtype)
    dy[rng.random(n) < 0.1] = np.nan
    dy[rng.random(n) < 0.1] = -0.0
    mask = rng.integers(0, 2, n).astype(np.int32)
    e, e64 = np.empty(0, dtype), np.empty(0)
    res = []
    for mod in (base, avx):
        d = dy.copy()
        g0, g1 = (d if in_place else np.full_like(dy, 7)), np.full_like(dy, 7)
        mod.eltwise_backward(2, [e, e], [g0, g1], e64, e, d, mask, False)
        res.append((g0.copy(), g1))
    for g, w in zip(res[1], res[0]):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
    np.testing.assert_array_equal(res[0][1].view(np.uint8), np.where(mask == 1, dy, dtype(0)).view(np.uint8))


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(shape=st.sampled_from([(2, 5, 3), (3, 17, 1), (2, 33, 70)]), dtype=DTYPES, seed=SEEDS)
def test_softmax_special_values_as_the_baseline_build(build, shape, dtype, seed):
    """NaN, +-inf and spreads past exp's range (x - max below ln(FLT_MIN) and ln(DBL_MIN)) through the SIMD builds'
    softmax forward, backward and loss: NaN exactly where the baseline build has it, the rest within a few ulps."""
    if not _cpu.cpu_has_avx2("FMA3"):
        pytest.skip(f"softmax_{build} is built with FMA: this CPU has none")
    base, avx = _pair("softmax", build)
    rng = np.random.default_rng(seed)
    outer, c, inner = shape
    x = (rng.standard_normal(outer * c * inner) * 40).astype(dtype)
    pick = rng.random(x.size) < 0.05
    x[pick] = rng.choice(np.array([np.nan, np.inf, -np.inf, -800.0, 800.0], dtype), int(pick.sum()))
    dy = rng.standard_normal(x.size).astype(dtype)
    lab = rng.integers(0, c, outer * inner).astype(np.int64)
    val = np.ones(outer * inner, np.uint8)
    res = []
    for mod in (base, avx):
        y, dx, p = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        with np.errstate(all="ignore"):
            mod.softmax_forward(x, y, *shape)
            mod.softmax_backward(y, dy, dx, *shape)
            loss = mod.softmax_loss_forward(x, p, lab, val, *shape)
        res.append((y, dx, p, np.array([loss])))
    r = 4e-6 if dtype == np.float32 else 1e-14
    for got, want in zip(res[1], res[0]):
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=r, atol=r)


def _channelwise_reference(op, x, dy, s, b, outer, dim, inner):
    """kernels.channelwise in NumPy: the outputs in the kernel's order of operations (so exactly its bits), the
    per-channel sums in float64 (the kernel's 8-lane order differs: compared within a tolerance)."""
    shp = (outer, dim, inner)
    x3, dy3 = x.reshape(shp), dy.reshape(shp)
    s3 = s.reshape(1, dim, 1) if s is not None else None
    b3 = b.reshape(1, dim, 1) if b is not None else None
    if op == 0:  # AFFINE
        y = x3 * s3 if s is not None else x3
        y = y + b3 if b is not None else y
        dx = dy3 * s3 if s is not None else dy3.copy()
        sum_dyx = (dy3.astype(np.float64) * x3).sum(axis=(0, 2))
    elif op == 1:  # PRELU: the float product dy * min(x, 0), summed in double
        y = np.where(x3 > 0, x3, s3 * x3)
        dx = dy3 * np.where(x3 <= 0, s3, np.ones_like(s3))
        sum_dyx = (dy3 * np.where(x3 < 0, x3, 0)).astype(np.float64).sum(axis=(0, 2))  # (NaN x: +0)
    else:  # SHIFT
        y = (x3 - b3) * s3
        dx = dy3 * s3
        sum_dyx = None
    return y.ravel(), dx.ravel(), sum_dyx, dy3.astype(np.float64).sum(axis=(0, 2))


@pytest.mark.parametrize("build", ["base", "avx512"])
@given(outer=st.integers(1, 3), dim=st.integers(1, 5), inner=st.sampled_from([1, 7, 8, 9, 23, 64, 16390]),
       op=st.sampled_from([0, 1, 2]), scale=st.booleans(), bias=st.booleans(), in_place=st.booleans(),
       dtype=DTYPES, seed=SEEDS)
def test_channelwise_builds_match_numpy_and_each_other(build, outer, dim, inner, op, scale, bias, in_place, dtype,
                                                       seed):
    """kernels.channelwise (forward and backward: Scale, Bias, PReLU, BatchNorm global) in the baseline and the
    AVX-512 build (backward sums as 8-wide GCC vectors) against NumPy: the outputs bit for bit (the same operations,
    no FMA), the per-channel sums in double within 1e-12 of the sum of the magnitudes (a different order than
    NumPy's); and the AVX-512 build's sums the baseline build's bits (the same 8 lanes in the same order). Inner
    sizes around the 8 lanes and past the 16384-element piece; in place (top is bottom, bottom diff is top diff)."""
    if build == "avx512" and not _cpu.cpu_has_avx512():
        pytest.skip(f"this CPU lacks AVX-512 ({', '.join(_cpu.AVX512_FEATURES)}): channelwise_avx512 cannot run here")
    base = importlib.import_module("caffe.layers.kernels.channelwise")
    mod = importlib.import_module(f"caffe.layers.kernels.channelwise{'' if build == 'base' else '_' + build}")
    if op != 0:
        scale = True
        bias = bias or op == 2
    if op == 2:
        bias = True
    rng = np.random.default_rng(seed)
    n = outer * dim * inner
    x = rng.uniform(-2, 2, n).astype(dtype)
    x[rng.random(n) < 0.05] = -0.0
    if op == 1:  # PReLU's selects: a NaN x is not below 0 (+0 in the sum, dx = dy); its top stays NaN
        x[rng.random(n) < 0.05] = np.nan
    dy = rng.uniform(-2, 2, n).astype(dtype)
    s = rng.uniform(-1.5, 1.5, dim).astype(dtype) if scale else None
    b = rng.uniform(-1.5, 1.5, dim).astype(dtype) if bias else None
    e, e64 = np.empty(0, dtype), np.empty(0)
    y_ref, dx_ref, dyx_ref, dy_ref = _channelwise_reference(op, x, dy, s, b, outer, dim, inner)
    got = []
    for m in (base, mod):
        y = x.copy() if in_place else np.empty_like(x)
        save = np.empty_like(x) if in_place else e
        m.channel_forward(op, y if in_place else x, s if scale else e, b if bias else e, y, save, outer, dim, inner)
        np.testing.assert_array_equal(y, y_ref)
        if in_place:
            np.testing.assert_array_equal(save, x)
        dx = dy.copy() if in_place else np.empty_like(dy)
        sum_dyx = np.full(dim, np.nan) if op != 2 else e64
        sum_dy = np.full(dim, np.nan) if op == 0 else e64
        m.channel_backward(1 if op == 1 else 0, dx if in_place else dy, x if op != 2 else e,
                           s if scale else e, dx, sum_dyx, sum_dy, outer, dim, inner)
        np.testing.assert_array_equal(dx, dx_ref)
        mag = (np.abs(dy.astype(np.float64)) * (np.nan_to_num(np.abs(x)) + 1)).reshape(outer, dim, inner).sum(
            axis=(0, 2))
        if op != 2:
            np.testing.assert_allclose(sum_dyx, dyx_ref, rtol=0, atol=1e-12 * mag.max())
        if op == 0:
            np.testing.assert_allclose(sum_dy, dy_ref, rtol=0, atol=1e-12 * mag.max())
        got.append((sum_dyx, sum_dy))
    for a, c in zip(got[0], got[1]):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(n=st.sampled_from([1, 15, 17, 4096, 4103, 40000]), dtype=DTYPES, seed=SEEDS, in_place=st.sampled_from([0, 1, 2]),
       op=st.sampled_from([0, 1]))
def test_eltwise_sum_prod_backward_builds_agree_bit_for_bit(build, n, dtype, seed, in_place, op):
    """Eltwise SUM (coefficients) and stable PROD backward with two bottoms (one vector pass in the AVX2 / AVX-512
    builds): the baseline build's bits and NumPy's (c_i dy; the other bottom times dy), NaN and -0 included; also
    with bottom diff 0 or 1 being the top diff (in place), on sizes around the 16- and 8-wide vectors and pieces."""
    base, avx = _pair("elementwise", build)
    rng = np.random.default_rng(seed)
    x0, x1, dy = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    dy[rng.random(n) < 0.05] = np.nan
    dy[rng.random(n) < 0.05] = -0.0
    coeff = np.array([0.5, -1.7]) if op == 1 else np.empty(0)
    want = ((dtype(0.5) * dy, dtype(-1.7) * dy) if op == 1 else (x1 * dy, x0 * dy))
    e = np.empty(0, dtype)
    res = []
    for mod in (base, avx):
        d = dy.copy()
        g = [np.full_like(dy, 7), np.full_like(dy, 7)]
        if in_place:
            g[in_place - 1] = d
        mod.eltwise_backward(op, [x0, x1] if op == 0 else [e, e], g, coeff, e, d, np.empty(0, np.int32), True)
        res.append([a.copy() for a in g])
    for got in res:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
