"""kernels.exact_gemm (the exact short-K forward from float32 data) against the exact sum, and conv_cpu's use of it.

Reference: each output's exact value S = sum_k w col + bias, taken with math.fsum (the correctly rounded
float64 of the exact sum: the products of float32 values are exact in float64), rounded once to float32.
The kernel sums in float64 in order, each step rounding at the 2^-53 level, so its float32 result is the
reference's except where S lies within that error of a float32 rounding tie (a midpoint between two
neighbouring float32 values). There the test accepts either neighbour of the tie, and only there: the
allowance is (K + 2) 2^-52 times the sum of the terms' magnitudes, far above the kernel's error bound and
far below a float32 ulp. The "dyadic" inputs (small integers scaled by powers of two) make every float64
partial sum exact and put many sums exactly on float32 ties: those must round half to even, with no
allowance.
"""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import conv_cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

eg = pytest.importorskip("caffe.layers.kernels.exact_gemm")

F32 = np.float32


def act_ref(y, act, a, b):
    """The activation on float32 values, as kernels.lowering's epilogue (and the layers) compute it."""
    y = y.astype(F32)
    a, b = F32(a), F32(b)
    if act == 1:
        return np.where(y <= 0, F32(0), y) if a == 0 else np.where(y > 0, y, y * a)
    if act == 2:
        return np.where(y < a, a, np.where(y > b, b, y))
    return y


def exact_sums(w, col, bias):
    """S[o, n] = fsum_k w[o, k] col[k, n] (+ bias[o]) and the sum of the terms' magnitudes, float64. The
    plain float64 sum serves where it is far from a float32 tie (its float32 rounding is then the exact
    sum's); math.fsum is taken for the others."""
    terms = w.astype(np.float64)[:, :, None] * col.astype(np.float64)[None]  # (O, K, n): exact products
    O, K, n = terms.shape
    flat = terms.transpose(0, 2, 1).reshape(O * n, K)
    if bias is not None:
        flat = np.concatenate([flat, np.repeat(bias.astype(np.float64), n)[:, None]], axis=1)
    S, mag = flat.sum(axis=1), np.abs(flat).sum(axis=1)
    near = near_tie(S, mag, 2 * flat.shape[1])[0]
    S[near] = [math.fsum(r) for r in flat[near].tolist()]
    return S.reshape(O, n), mag.reshape(O, n)


def near_tie(S, mag, K):
    """Where S is within the allowance of a float32 rounding tie; the two neighbours of that tie."""
    r = S.astype(F32)
    lo, hi = np.nextafter(r, F32(-np.inf)), np.nextafter(r, F32(np.inf))
    m_lo = (r.astype(np.float64) + lo.astype(np.float64)) / 2
    m_hi = (r.astype(np.float64) + hi.astype(np.float64)) / 2
    tol = (K + 2) * 2.0 ** -52 * mag
    below = np.abs(S - m_lo) <= tol
    above = np.abs(S - m_hi) <= tol
    return below | above, np.where(below, lo, r), np.where(below, r, hi)


def check(out, S, mag, K, act, a, b, allow_ties=True):
    tie, t0, t1 = near_tie(S, mag, K)
    tie &= allow_ties
    want = act_ref(S.astype(F32), act, a, b)
    alt0, alt1 = act_ref(t0, act, a, b), act_ref(t1, act, a, b)
    same = (out == want) | (np.isnan(out) & np.isnan(want))
    ok = same | (tie & ((out == alt0) | (out == alt1)))
    assert ok.all(), (out[~ok], want[~ok], S[~ok])


def run_case(G, og, kd, nb, ncols, layout, extra, off, bias_on, act, a, b, values, seed, simd=True):
    rng = np.random.default_rng(seed)
    if values == "dyadic":  # exact float64 sums, many exactly on float32 ties
        w = (rng.integers(-2 ** 12, 2 ** 12, G * og * kd) * 2.0 ** -6).astype(F32)
        draw = lambda n: (rng.integers(-2 ** 12, 2 ** 12, n) * 2.0 ** -3).astype(F32)  # noqa: E731
    else:
        w = rng.standard_normal(G * og * kd).astype(F32)
        draw = lambda n: rng.standard_normal(n).astype(F32)  # noqa: E731
    rows = G * kd
    if layout == "lowered":  # a column block (rows, nb * ncols)
        col_ld, col_img = nb * ncols, ncols
        col = draw(rows * nb * ncols)
    else:  # a blob (nb, rows, P) read in place, P >= ncols
        P = ncols + extra
        col_ld, col_img = P, rows * P
        col = draw(nb * rows * P)
    bias = draw(G * og) if bias_on else None
    out_ld = ncols + extra
    out_img = G * og * out_ld + extra
    out = np.full(off + nb * out_img + 3, np.nan, F32)
    eg.gemm(w, col, out, bias, G, og, kd, nb, ncols, col_ld, col_img, out_ld, out_img, off, act, a, b, simd)
    written = np.zeros(out.shape, bool)
    w3 = w.reshape(G, og, kd)
    for i in range(nb):
        for g in range(G):
            c = np.stack([col[(g * kd + k) * col_ld + i * col_img:][:ncols] for k in range(kd)])
            S, mag = exact_sums(w3[g], c, None if bias is None else bias[g * og:(g + 1) * og])
            idx = off + i * out_img + (g * og + np.arange(og))[:, None] * out_ld + np.arange(ncols)[None]
            check(out[idx], S, mag, kd, act, a, b, allow_ties=values != "dyadic")
            written[idx] = True
    assert np.isnan(out[~written]).all()  # nothing outside the destination block is touched
    return out


ACTS = st.sampled_from([(0, 0.0, 0.0), (1, 0.0, 0.0), (1, 0.1, 0.0), (2, -0.5, 0.75), (2, 0.0, 6.0)])


@given(G=st.integers(1, 3), og=st.integers(1, 9), kd=st.integers(1, 32), nb=st.integers(1, 3),
       ncols=st.one_of(st.integers(1, 30), st.integers(90, 130)), layout=st.sampled_from(["lowered", "blob"]),
       extra=st.integers(0, 5), off=st.integers(0, 4), bias=st.booleans(), act=ACTS,
       values=st.sampled_from(["normal", "dyadic"]), nc=st.sampled_from([12, 24, 96]), avx512=st.booleans(),
       seed=st.integers(0, 99))
def test_exact_gemm_is_the_exact_sum_rounded_once(G, og, kd, nb, ncols, layout, extra, off, bias, act, values,
                                                   nc, avx512, seed):
    """... by the AVX-512 tile (24 columns; where the CPU has AVX-512F) and the AVX2 tile alike."""
    old, old512 = eg.NC, eg.AVX512
    eg.set_columns(nc)
    eg.AVX512 = avx512
    try:
        out = run_case(G, og, kd, nb, ncols, layout, extra, off, bias, *act, values, seed)
        scalar = run_case(G, og, kd, nb, ncols, layout, extra, off, bias, *act, values, seed, simd=False)
    finally:
        eg.set_columns(old)
        eg.AVX512 = old512
    np.testing.assert_array_equal(out, scalar)  # the scalar path sums in the same order: the same bits


@pytest.mark.parametrize("act", [(1, 0.0, 0.0), (1, 0.25, 0.0), (2, -1.0, 1.0), (0, 0.0, 0.0)])
def test_exact_gemm_tiles_agree_bit_for_bit_on_nan_inf_and_signed_zero(act):
    """The AVX-512 tile (24 columns), the AVX2 tile (12) and the scalar path: the same bits, NaN payloads and
    signed zeros included, over 53 columns (two wide tiles, a 12-column tile's worth left over, a partial one)."""
    rng = np.random.default_rng(7)
    kd, og, ncols = 9, 6, 53
    w = rng.standard_normal(og * kd).astype(F32)
    col = rng.standard_normal(kd * ncols).astype(F32)
    col[rng.integers(0, col.size, 12)] = np.array([np.nan, np.inf, -np.inf, -0.0] * 3, F32)
    col[:ncols] = np.where(np.arange(ncols) % 7 == 0, F32(-0.0), col[:ncols])
    bias = rng.standard_normal(og).astype(F32)
    outs = []
    old512 = eg.AVX512
    try:
        for avx512, simd in ((True, True), (False, True), (False, False)):
            eg.AVX512 = avx512
            out = np.empty(og * ncols, F32)
            eg.gemm(w, col, out, bias, 1, og, kd, 1, ncols, ncols, 0, ncols, og * ncols, 0, *act, simd)
            outs.append(out.tobytes())
    finally:
        eg.AVX512 = old512
    assert outs[0] == outs[1] == outs[2]


def test_exact_gemm_on_two_threads_and_many_tasks():
    """A case big enough for the parallel region (MobileNet's 1x1 widths), odd columns, with a bias."""
    run_case(1, 64, 32, 2, 131, "blob", 3, 1, True, 1, 0.0, 0.0, "normal", 5)


def test_exact_gemm_rounds_ties_to_even():
    """Sums exactly on a float32 tie: 2^24 + 1 lies between 2^24 and 2^24 + 2 and rounds to 2^24;
    2^24 + 3 rounds up to 2^24 + 4."""
    w = np.array([1, 1, 1], F32)
    col = np.array([2 ** 23, 2 ** 23, 2 ** 23, 2 ** 23, 1, 3], F32)  # (3 rows, 2 columns)
    out = np.zeros(2, F32)
    eg.gemm(w, col, out, None, 1, 1, 3, 1, 2, 2, 0, 2, 2)
    assert out.tolist() == [2 ** 24, 2 ** 24 + 4]


def test_exact_gemm_rejects_bad_arguments():
    w, col, out = np.zeros(4, F32), np.zeros(8, F32), np.zeros(8, F32)
    with pytest.raises(ValueError, match="activation"):
        eg.gemm(w, col, out, None, 1, 2, 2, 1, 4, 4, 0, 4, 0, act=3)
    with pytest.raises(ValueError, match="column buffer"):
        eg.gemm(w, col, out, None, 1, 2, 2, 1, 5, 5, 0, 4, 0)
    with pytest.raises(ValueError, match="output buffer"):
        eg.gemm(w, col, out, None, 1, 2, 2, 1, 4, 4, 0, 5, 0)
    with pytest.raises(ValueError, match="weight buffer"):
        eg.gemm(w, col, out, None, 1, 3, 2, 1, 4, 4, 0, 4, 0)
    with pytest.raises(ValueError, match="bias buffer"):
        eg.gemm(w, col, out, np.zeros(1, F32), 1, 2, 2, 1, 4, 4, 0, 4, 0)
    with pytest.raises(ValueError, match="sizes"):
        eg.gemm(w, col, out, None, 0, 2, 2, 1, 4, 4, 0, 4, 0)


# -- conv_cpu's exact forward through the kernel (EXACT_GEMM) against the float64-GEMM path ----------------

FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"


@pytest.mark.parametrize("type_name, text, shape", [
    ("Convolution", "num_output: 5 kernel_size: 5", (3, 1, 12, 11)),    # LeNet conv1: blocks and bands
    ("Deconvolution", "num_output: 1 kernel_size: 5", (3, 5, 12, 11)),  # its twin (K = 25)
] + [(t, text, shape) for t in ("Convolution", "Deconvolution") for text, shape in [
    ("num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 6, 9, 8)),  # groups of 3 channels, K = 27
    ("num_output: 7 kernel_size: 1", (3, 20, 6, 5)),                      # 1x1: the blob read in place
    ("num_output: 10 kernel_size: 1 group: 2", (2, 8, 3, 7)),             # 1x1 groups
]])
def test_conv_exact_forward_by_the_kernel_is_the_float64_paths(type_name, text, shape):
    """Forward (Convolution) and bottom diff (Deconvolution's exact forward, with and without the weight
    diff) through kernels.exact_gemm: the same bits as the float64 lowering and GEMM, with small blocks
    (several images, bands of rows) and whole-batch blocks; the kernel is really called."""
    if not conv_cpu.EXACT_GEMM:
        pytest.skip("kernels.exact_gemm is not vectorized on this CPU: conv_cpu keeps the float64 path")
    rng = np.random.default_rng(11)
    x = rng.normal(size=shape).astype(np.float32)
    calls = []
    runs = {}
    for kernel in (False, True):
        for small in (False, True):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(conv_cpu, "EXACT_GEMM", kernel)
                if small:
                    mp.setattr(conv_cpu, "COL_BLOCK_BYTES", 600)
                    mp.setattr(conv_cpu, "MIN_BLOCK_COLS", 8)
                    mp.setattr(conv_cpu, "ONE_BY_ONE_VIEW_COLS", 64)
                real = conv_cpu._eg.gemm
                mp.setattr(conv_cpu._eg, "gemm", lambda *a: (calls.append(kernel), real(*a)))
                context.set_random_seed(3)
                layer = make_layer(type_name, f"convolution_param {{ {text} {FILL} }}")
                bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
                layer.SetUp(bottom, top)
                assert layer.exact_forward(np.float32) and layer.plan(np, np.float32) in ("1x1", "blocked")
                layer.Forward(bottom, top)
                top[0].diff[...] = np.random.default_rng(8).normal(size=top[0].shape).astype(np.float32)
                out = [top[0].data.copy()]
                if type_name == "Deconvolution":
                    for weights in (True, False):
                        layer.set_param_propagate_down(0, weights)
                        layer.Backward(top, [True], bottom)
                        out.append(bottom[0].diff.copy())
                runs[kernel, small] = out
    assert True in calls and False not in calls
    for small in (False, True):
        for new, old in zip(runs[True, small], runs[False, small]):
            np.testing.assert_array_equal(new, old)


@pytest.mark.parametrize("act", [(1, 0.0, 0.0), (1, 0.25, 0.0), (2, -1.0, 1.0), (0, 0.0, 0.0)])
def test_exact_gemm_activation_on_nan_and_signed_zero(act):
    """NaN sums stay NaN under every activation (Caffe's ReLU max(x, 0) + slope * min(x, 0) included); a sum of
    -0 products is +0 (the sum starts from +0, as the float64 GEMM's does). The codes are lowering's."""
    from caffe.layers.kernels import lowering
    assert [int(v) for v in (eg.Act.ACT_NONE, eg.Act.ACT_RELU, eg.Act.ACT_CLIP)] == \
        [int(v) for v in (lowering.Act.ACT_NONE, lowering.Act.ACT_RELU, lowering.Act.ACT_CLIP)]
    w = np.array([1.0, -1.0], F32)
    col = np.array([np.nan, -0.0, -2.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0, 1.0], F32)  # (2 rows, 5 columns)
    sums = np.array([np.nan, 0.0, -3.0, 1.0, -0.5], F32)
    for simd in (True, False):
        out = np.empty(5, F32)
        eg.gemm(w, col, out, None, 1, 1, 2, 1, 5, 5, 0, 5, 5, 0, *act, simd)
        np.testing.assert_array_equal(out, act_ref(sums, *act))
        assert not np.signbit(out[1])


def test_exact_forward_keeps_its_float32_block_for_the_weight_diff():
    """A training step of a LeNet conv1-like layer (one lowered block): the kernel path's float32 column
    block serves the backward's weight diff (one lowering per step, the float64 path needs two), with the
    same forward and diffs as the float64 path."""
    if not conv_cpu.EXACT_GEMM:
        pytest.skip("kernels.exact_gemm is not vectorized on this CPU: conv_cpu keeps the float64 path")
    x = np.random.default_rng(3).normal(size=(4, 1, 12, 12)).astype(np.float32)
    dy = np.random.default_rng(4).normal(size=(4, 5, 8, 8)).astype(np.float32)
    results, lowerings = {}, {}
    for kernel in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_cpu, "EXACT_GEMM", kernel)
            real, count = conv_cpu._lowered, []
            mp.setattr(conv_cpu, "_lowered", lambda *a, **k: (count.append(1), real(*a, **k))[1])
            context.set_random_seed(3)
            layer = make_layer("Convolution", f"convolution_param {{ num_output: 5 kernel_size: 5 {FILL} }}")
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            layer.Forward(bottom, top)
            top[0].diff[...] = dy
            layer.Backward(top, [False], bottom)
            results[kernel] = (top[0].data.copy(), layer.blobs[0].diff.copy(), layer.blobs[1].diff.copy())
            lowerings[kernel] = len(count)
    assert lowerings == {True: 1, False: 2}
    for new, old in zip(results[True], results[False]):
        np.testing.assert_array_equal(new, old)


# ---- dots_nt: the exact layers' weight gradient ----------------------------------------------------------------

def dots_reference(a, b):
    """float32(s) per (m, n): the 8 partial sums over k = j (mod 8), each in increasing k from +0 (cumsum adds
    left to right), then p0 + p1 + ... + p7: the kernel's order, so its bits."""
    M, N = a.shape[0], b.shape[0]
    out = np.empty((M, N), np.float64)
    for m in range(M):
        for n in range(N):
            prod = a[m].astype(np.float64) * b[n].astype(np.float64)
            p = [np.cumsum(np.concatenate([[0.0], prod[j::8]]))[-1] for j in range(8)]
            s = p[0]
            for j in range(1, 8):
                s += p[j]
            out[m, n] = s
    return out.astype(np.float32)


@given(M=st.integers(1, 9), N=st.integers(1, 9), K=st.sampled_from([0, 1, 7, 8, 9, 31, 64, 100]),
       pad=st.integers(0, 3), off=st.integers(0, 5), seed=st.integers(0, 2**31 - 1),
       mode=st.sampled_from(["avx512", "avx2", "scalar"]), special=st.booleans())
def test_dots_nt_is_the_partial_sums_rounded_once(M, N, K, pad, off, seed, mode, special):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(M, K + pad)).astype(np.float32)
    b = rng.normal(size=(N, K + pad)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 1e3]))
    if special and K:
        a[rng.integers(0, M), rng.integers(0, K)] = rng.choice([np.inf, -np.inf, np.nan, -0.0])
    base = rng.normal(size=M * N + off).astype(np.float32)
    want = base.copy()
    with np.errstate(all="ignore"):
        want[off:] += dots_reference(a[:, :K], b[:, :K]).reshape(-1)
    old512 = eg.AVX512
    eg.AVX512 = mode == "avx512"
    try:
        out = base.copy()
        eg.dots_nt(np.concatenate([np.zeros(off, np.float32), a.reshape(-1)]), off, K + pad, b.reshape(-1), 0,
                   K + pad, out, off, N, M, N, K, mode != "scalar")
    finally:
        eg.AVX512 = old512
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_dots_nt_rejects_what_does_not_fit():
    a = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match=r"dots_nt: a \(10 elements\) does not hold 3 rows of 4 from offset 0, 4 apart"):
        eg.dots_nt(a, 0, 4, a, 0, 4, np.zeros(9, np.float32), 0, 3, 3, 2, 4)
    with pytest.raises(ValueError, match=r"out \(5 elements\) does not hold 2 rows of 3"):
        eg.dots_nt(a, 0, 4, a, 0, 4, np.zeros(5, np.float32), 0, 3, 2, 3, 2)


@pytest.mark.parametrize("text, shape, small", [
    ("num_output: 5 kernel_size: 5", (4, 1, 12, 12), False),                  # LeNet conv1-like, one block
    ("num_output: 5 kernel_size: 5", (4, 1, 12, 12), True),                   # bands of rows of one image
    ("num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2", (3, 6, 9, 8), False),  # groups, K = 27
    ("num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2", (3, 6, 9, 8), True),
    ("num_output: 7 kernel_size: 1", (3, 20, 6, 5), False),                   # 1x1, K = 20
])
def test_conv_exact_weight_diff_is_the_float64_sum_rounded_once(text, shape, small):
    """The weight diff of an exact layer (conv_cpu.EXACT_WGRAD): accumulated onto the diff block by block, each
    block's term the float64 sum over its positions rounded once (dots_nt's order is within float64 rounding of
    the exact sum, so it rounds the same but at ties), by dots_nt or, without AVX2 and FMA (EXACT_GEMM off), by
    a float64 GEMM; with EXACT_WGRAD off, the float32 GEMM's (close, not equal)."""
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    results = {}
    for exact in (True, "float64 GEMM", False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_cpu, "EXACT_WGRAD", bool(exact))
            if exact == "float64 GEMM":
                mp.setattr(conv_cpu, "EXACT_GEMM", False)
            if small:
                mp.setattr(conv_cpu, "COL_BLOCK_BYTES", 600)
                mp.setattr(conv_cpu, "MIN_BLOCK_COLS", 8)
            calls = []
            real = conv_cpu._eg.dots_nt if conv_cpu._eg is not None else None
            if real is not None:
                mp.setattr(conv_cpu._eg, "dots_nt", lambda *a: (calls.append(1), real(*a)))
            context.set_random_seed(3)
            layer = make_layer("Convolution", f"convolution_param {{ {text} {FILL} }}")
            bottom, top = blobs_from_arrays([x], np.float32), empty_tops(1, np.float32)
            layer.SetUp(bottom, top)
            assert layer.exact_forward(np.float32)
            layer.Forward(bottom, top)
            top[0].diff[...] = np.random.default_rng(4).normal(size=top[0].shape).astype(np.float32)
            layer.blobs[0].diff[...] = 0.25  # accumulated onto
            layer.Backward(top, [False], bottom)
            results[exact] = layer.blobs[0].diff.copy()
            assert bool(calls) == (exact is True and conv_cpu.EXACT_GEMM)
            plan = layer.cpu_blocks(shape[0], np.float32, exact=False)
            blocks, OW = plan.blocks, plan.OW  # (a 1x1 layer's blocks count positions as one row of P)
    # the float64 reference: per output channel o and filter tap r, fsum over images and positions
    w = layer.blobs[0]
    g = layer.group
    col_rows = []
    for n in range(shape[0]):
        col_rows.append(conv_reference_columns(layer, x[n]))  # (g kd, P)
    col = np.concatenate(col_rows, axis=1).astype(np.float64)
    dy = np.random.default_rng(4).normal(size=top[0].shape).astype(np.float32)
    Co, P = dy.shape[1], dy.shape[2] * dy.shape[3]
    og, kd = Co // g, layer.kernel_dim
    want = np.full((Co, kd), 0.25, np.float32)
    for n0, n1, oh0, oh1 in blocks:  # the block's positions, image by image
        pos = np.concatenate([np.arange(n * P + oh0 * OW, n * P + oh1 * OW) for n in range(n0, n1)])
        rows = dy.transpose(1, 0, 2, 3).reshape(Co, -1)[:, pos].astype(np.float64)
        term = np.concatenate([rows[gi * og:(gi + 1) * og] @ col[gi * kd:(gi + 1) * kd, pos].T for gi in range(g)])
        want += term.astype(np.float32)
    assert len(blocks) > 1 if small else len(blocks) == 1
    want = want.reshape(w.shape)
    np.testing.assert_array_equal(results[True], want)
    np.testing.assert_array_equal(results["float64 GEMM"], want)
    np.testing.assert_allclose(results[False], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def conv_reference_columns(layer, image):
    """im2col of one image (C, H, W) in plain NumPy: (C kh kw, OH OW), Caffe's row order."""
    geo = layer.geom
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geo.kernel, geo.stride, geo.pad, geo.dilation
    OH, OW = geo.col_shape
    C, H, W = image.shape
    padded = np.zeros((C, H + 2 * ph, W + 2 * pw), np.float32)
    padded[:, ph:ph + H, pw:pw + W] = image
    cols = np.empty((C, kh, kw, OH, OW), np.float32)
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = padded[:, i * dh:i * dh + sh * OH:sh, j * dw:j * dw + sw * OW:sw][:, :OH, :OW]
    return cols.reshape(C * kh * kw, OH * OW)
