"""The dense direct convolution kernels (kernels.conv_direct_avx2) and conv_cpu's "dense" plan against NumPy.

References: a float64 convolution by slices of the zero-padded image (written here), and the layer's
generic batched path (conv_base.CPU_PATHS = False). Tolerances are float32's: each error is bounded by
a small multiple of the float32 epsilon times the same sum taken over absolute values.

The kernel tests run each variant: AVX2 (8 lanes) and, where the CPU has AVX-512F, AVX-512 (16 lanes; cd.AVX512
chooses) with either forward tile: vectors over output channels ("avx512", cd.OC_FORWARD, the default) or over
positions ("avx512_pos"). All run each output's FMAs and each weight diff's sums in the same order, so they must
also agree bit for bit (test_avx512_gives_the_avx2_bits).
"""
import contextlib

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.layers import conv_base, conv_cpu
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

cd = pytest.importorskip("caffe.layers.kernels.conv_direct_avx2")

# The kernels run (plain C loops) without AVX2 too; the plan only chooses them where they are vectorized.
SUPPORTED = cd.supported()
AVX512 = cd.avx512_supported()
NO_AVX512 = "this CPU has no AVX-512F (the AVX-512 variants cannot run; the AVX2 ones are tested)"
VARIANTS = pytest.mark.parametrize("variant", ["avx2"] + [
    pytest.param(v, marks=pytest.mark.skipif(not AVX512, reason=NO_AVX512)) for v in ("avx512", "avx512_pos")])


@contextlib.contextmanager
def kernel_variant(variant, oc_rule=False):
    """cd.AVX512 and cd.OC_FORWARD for the variant "avx2", "avx512" (the oc forward: on every layer, or where
    its rule takes it with oc_rule) or "avx512_pos" (the position-vector forward), restored after. Pack the
    filters inside: the layout follows the variant."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cd, "AVX512", variant.startswith("avx512"))
        mp.setattr(cd, "OC_FORWARD", variant == "avx512")
        if not oc_rule:
            mp.setattr(cd, "OC_MIN_OUT", 1)
            mp.setattr(cd, "OC_MIN_KD", 1)
        yield
FILL = "weight_filler { type: 'gaussian' std: 0.7 } bias_filler { type: 'gaussian' std: 0.5 }"
EPS = 1e-4  # error bound: EPS times the absolute sum (float32, sums of up to ~1,000 terms in tests)


def ref_conv(x, w, ph, pw, group):
    """float64 stride-1 convolution (N, C, H, W) * (Co, cg, kh, kw) -> (N, Co, OH, OW), per group."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    Co, cg, kh, kw = w.shape
    og = Co // group
    xp = np.pad(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)])
    OH, OW = H + 2 * ph - kh + 1, W + 2 * pw - kw + 1
    y = np.zeros((N, group, og, OH, OW))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + OH, j:j + OW].reshape(N, group, cg, OH, OW)
            y += np.einsum("ngchw,goc->ngohw", patch, w[:, :, i, j].reshape(group, og, cg))
    return y.reshape(N, Co, OH, OW)


def ref_weight(x, dy, kh, kw, ph, pw, group):
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    N, C, H, W = x.shape
    Co, OH, OW = dy.shape[1:]
    cg, og = C // group, Co // group
    xp = np.pad(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)])
    dw = np.zeros((Co, cg, kh, kw))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + OH, j:j + OW].reshape(N, group, cg, OH, OW)
            dw[:, :, i, j] = np.einsum("ngohw,ngchw->goc", dy.reshape(N, group, og, OH, OW), patch).reshape(Co, cg)
    return dw


def ref_data(dy, w, H, W, ph, pw, group):
    """The adjoint of ref_conv: dx (N, C, H, W) from dy, by scattering each tap."""
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    N, Co, OH, OW = dy.shape
    _, cg, kh, kw = w.shape
    og = Co // group
    dxp = np.zeros((N, group, cg, H + 2 * ph, W + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            dxp[..., i:i + OH, j:j + OW] += np.einsum("ngohw,goc->ngchw", dy.reshape(N, group, og, OH, OW),
                                                      w[:, :, i, j].reshape(group, og, cg))
    return dxp[..., ph:ph + H, pw:pw + W].reshape(N, group * cg, H, W)


def assert_close(got, ref, bound):
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= EPS * bound + 1e-6), f"max error {err.max():.3g} (bound {(EPS * bound).max():.3g})"


@st.composite
def geometries(draw):
    """Odd and tiny shapes: channels off the 4-channel block, widths off the 8-lane vector, pad 0..k-1."""
    group = draw(st.integers(1, 2))
    cg, og = draw(st.integers(1, 11)), draw(st.integers(1, 9))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
    H = draw(st.integers(max(1, kh - 2 * ph), max(1, kh - 2 * ph) + 9))
    W = draw(st.integers(max(1, kw - 2 * pw), max(1, kw - 2 * pw) + 19))
    return dict(N=draw(st.integers(1, 3)), G=group, cg=cg, og=og, kh=kh, kw=kw, ph=ph, pw=pw, H=H, W=W,
                seed=draw(st.integers(0, 2**31 - 1)))


def _arrays(g):
    rng = np.random.default_rng(g["seed"])
    N, G, cg, og, kh, kw, ph, pw, H, W = (g[k] for k in ("N", "G", "cg", "og", "kh", "kw", "ph", "pw", "H", "W"))
    OH, OW = H + 2 * ph - kh + 1, W + 2 * pw - kw + 1
    x = rng.normal(size=(N, G * cg, H, W)).astype(np.float32)
    w = rng.normal(size=(G * og, cg, kh, kw)).astype(np.float32)
    b = rng.normal(size=G * og).astype(np.float32)
    dy = rng.normal(size=(N, G * og, OH, OW)).astype(np.float32)
    args = (N, G * cg, H, W, G * og, G, kh, kw, ph, pw, OH, OW)
    return x, w, b, dy, args


def _pack(w, G, flip=False):
    Co, cg, kh, kw = w.shape
    packed = np.full(cd.packed_size(G, Co // G, cg, kh, kw, flip), np.nan, np.float32)
    cd.pack_weights(w.reshape(-1), packed, G, Co // G, cg, kh, kw, flip)
    return packed


def ref_pack(w, G, flip):
    """pack_weights' layout in NumPy: [G][nb][inc][kh][kw][4], 4 output channels a block, zeros past them;
    flip: the adjoint's filters (output and input channels swapped, taps reversed)."""
    Co, cg, kh, kw = w.shape
    og = Co // G
    w5 = w.reshape(G, og, cg, kh, kw)
    if flip:
        w5 = w5.transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
    outc, inc = w5.shape[1], w5.shape[2]
    nb = -(-outc // 4)
    p = np.zeros((G, nb * 4, inc, kh, kw), np.float32)
    p[:, :outc] = w5
    return p.reshape(G, nb, 4, inc, kh, kw).transpose(0, 1, 3, 4, 5, 2).ravel()


def oc_blocks(outc):
    """The oc forward's blocks: ceil(outc / 48) of them share the ceil(outc / 16) vectors of 16 outputs evenly
    (the first ones one more); (first output, vectors) each."""
    nvec = -(-outc // 16)
    nblk = -(-nvec // 3)
    sizes = [nvec // nblk + (b < nvec % nblk) for b in range(nblk)]
    starts = np.cumsum([0] + sizes[:-1])
    return [(16 * int(s0), v) for s0, v in zip(starts, sizes)]


def ref_pack_oc(w, G, flip):
    """The oc forward's layout: [G][block][inc][kh][kw][16 V], zeros past the group's outputs."""
    Co, cg, kh, kw = w.shape
    og = Co // G
    w5 = w.reshape(G, og, cg, kh, kw)
    if flip:
        w5 = w5.transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
    outc = w5.shape[1]
    parts = []
    for g in range(G):
        for o0, v in oc_blocks(outc):
            blk = w5[g, o0:o0 + 16 * v]  # (valid, inc, kh, kw)
            p = np.zeros((16 * v,) + blk.shape[1:], np.float32)
            p[:blk.shape[0]] = blk
            parts.append(p.transpose(1, 2, 3, 0).ravel())
    return np.concatenate(parts)


def test_oc_blocks_share_the_vectors():
    """The reference's blocks, and the kernel's layout for 64 outputs written out by hand: two blocks of 32
    outputs (not 48 + 16, whose 1-vector tile is bound by its broadcasts)."""
    assert oc_blocks(16) == [(0, 1)] and oc_blocks(48) == [(0, 3)]
    assert oc_blocks(64) == [(0, 2), (32, 2)]
    assert oc_blocks(128) == [(0, 3), (48, 3), (96, 2)]
    assert oc_blocks(130) == [(0, 3), (48, 3), (96, 3)]  # 9 vectors, the last one 2 channels
    if not AVX512:
        pytest.skip(NO_AVX512)
    w = np.arange(64 * 2, dtype=np.float32).reshape(64, 2, 1, 1)  # 64 outputs, 2 inputs, 1 x 1
    by_hand = np.concatenate([w[0:32, 0, 0, 0], w[0:32, 1, 0, 0], w[32:64, 0, 0, 0], w[32:64, 1, 0, 0]])
    with kernel_variant("avx512"):
        np.testing.assert_array_equal(_pack(w, 1), by_hand)


def test_oc_rule_chooses_the_layout():
    """By default the oc forward (and its layout) takes forward calls with >= OC_MIN_OUT outputs a group and a
    kernel_dim >= OC_MIN_KD; the rest keep the 4-channel blocks."""
    if not AVX512:
        pytest.skip(NO_AVX512)
    four = lambda G, outc, inc, k: G * -(-outc // 4) * 4 * inc * k * k  # noqa: E731
    oc = lambda G, outc, inc, k: G * 16 * -(-outc // 16) * inc * k * k  # noqa: E731
    with kernel_variant("avx512", oc_rule=True):
        for G, og, cg, k, flip in [(1, 33, 29, 3, False), (2, 33, 29, 3, False), (1, 64, 16, 4, False),
                                   (1, 31, 64, 3, False), (1, 100, 28, 3, False), (1, 29, 33, 3, True)]:
            outc, inc = (cg, og) if flip else (og, cg)
            want = oc if outc >= cd.OC_MIN_OUT and inc * k * k >= cd.OC_MIN_KD else four
            assert cd.packed_size(G, og, cg, k, k, flip) == want(G, outc, inc, k), (G, og, cg, k, flip)


LAYOUTS = pytest.mark.parametrize("variant", ["avx2", pytest.param("avx512", marks=pytest.mark.skipif(
    not AVX512, reason=NO_AVX512))])


def _ref_layout(variant, w, G, flip):
    return ref_pack_oc(w, G, flip) if variant == "avx512" else ref_pack(w, G, flip)


@LAYOUTS
@given(G=st.integers(1, 3), og=st.one_of(st.integers(1, 13), st.integers(14, 100)), cg=st.integers(1, 13),
       kh=st.integers(1, 5), kw=st.integers(1, 5), flip=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_pack_weights_layout(variant, G, og, cg, kh, kw, flip, seed):
    """Every packed value, padding channels included (the NaN fill shows any left unwritten): the 4-channel
    blocks (AVX2 and the position-vector AVX-512 forward) and the oc forward's 48-channel blocks."""
    w = np.random.default_rng(seed).normal(size=(G * og, cg, kh, kw)).astype(np.float32)
    with kernel_variant(variant):
        np.testing.assert_array_equal(_pack(w, G, flip), _ref_layout(variant, w, G, flip))


@LAYOUTS
@pytest.mark.parametrize("flip", [False, True])
def test_pack_weights_layout_of_a_layer_the_threads_share(variant, flip):
    """CaffeNet conv2's filters (2 groups of 128 x 48 x 5 x 5, past the one-thread size): the blocks the OpenMP
    threads split give NumPy's layout too."""
    w = np.random.default_rng(5).normal(size=(256, 48, 5, 5)).astype(np.float32)
    with kernel_variant(variant):
        np.testing.assert_array_equal(_pack(w, 2, flip), _ref_layout(variant, w, 2, flip))


@VARIANTS
@given(g=geometries(), bias=st.booleans(), run_bytes=st.sampled_from([1, 24 << 10]))
def test_forward_matches_the_reference(variant, g, bias, run_bytes):
    x, w, b, dy, args = _arrays(g)
    y = np.full(dy.shape, np.nan, np.float32)
    # 1: runs of 8 (AVX-512: 4) input channels, the partial sums stored between runs
    prev, prev512 = cd.set_run_bytes(run_bytes), cd.set_avx512_run_bytes(run_bytes)
    try:
        with kernel_variant(variant):
            cd.forward(x.reshape(-1), _pack(w, g["G"]), b if bias else None, y.reshape(-1), *args)
    finally:
        cd.set_run_bytes(prev)
        cd.set_avx512_run_bytes(prev512)
    ref = ref_conv(x, w, g["ph"], g["pw"], g["G"]) + (b.reshape(1, -1, 1, 1) if bias else 0)
    bound = ref_conv(np.abs(x), np.abs(w), g["ph"], g["pw"], g["G"]) + (np.abs(b).reshape(1, -1, 1, 1) if bias else 0)
    assert_close(y, ref, bound)


@VARIANTS
@given(g=geometries())
def test_bottom_diff_is_the_flipped_forward(variant, g):
    """dx = W^T dy: the forward kernel on dy with pack_weights(flip=True) and padding k - 1 - pad."""
    x, w, b, dy, args = _arrays(g)
    N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW = args
    dx = np.full(x.shape, np.nan, np.float32)
    with kernel_variant(variant):
        cd.forward(dy.reshape(-1), _pack(w, G, flip=True), None, dx.reshape(-1),
                   N, Co, OH, OW, C, G, kh, kw, kh - 1 - ph, kw - 1 - pw, H, W)
    assert_close(dx, ref_data(dy, w, H, W, ph, pw, G), ref_data(np.abs(dy), np.abs(w), H, W, ph, pw, G))


@VARIANTS
@given(g=geometries(), tasks=st.sampled_from([1, 7]), band=st.sampled_from([1, 16 << 10]), bias=st.booleans(),
       group_bytes=st.sampled_from([1, 4 << 20]))
def test_weight_diff_oc_accumulates(variant, g, tasks, band, bias, group_bytes):
    """backward_weight_oc: dw += the correlation and bias_diff += the sums of dy, with output channels off
    the 8-lane vector and the 4-vector block, tiles spanning input channels, one or several runs of tiles
    per image group (tasks), bands of 64 positions or whole images, one image group or one per image."""
    x, w, b, dy, args = _arrays(g)
    kh, kw, ph, pw, G = g["kh"], g["kw"], g["ph"], g["pw"], g["G"]
    rng = np.random.default_rng(g["seed"] + 1)
    start, bstart = rng.normal(size=w.shape).astype(np.float32), rng.normal(size=b.shape).astype(np.float32)
    dw, db = start.copy(), bstart.copy()
    with pytest.MonkeyPatch.context() as mp, kernel_variant(variant):
        mp.setattr(cd, "WO_TASKS_PER_THREAD", tasks)
        mp.setattr(cd, "WO_GROUP_BYTES", group_bytes)  # 1: all images in one group
        cd.set_wo_band_bytes(band)  # 1: bands of 64 positions (whole rows)
        try:
            cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), dw.reshape(-1), *args, bias_diff=db if bias else None)
        finally:
            cd.set_wo_band_bytes(16 << 10)
    ref = start + ref_weight(x, dy, kh, kw, ph, pw, G)
    assert_close(dw, ref, np.abs(start) + ref_weight(np.abs(x), np.abs(dy), kh, kw, ph, pw, G))
    ref_b = bstart + (dy.astype(np.float64).sum(axis=(0, 2, 3)) if bias else 0)
    assert_close(db, ref_b, np.abs(bstart) + (np.abs(dy).astype(np.float64).sum(axis=(0, 2, 3)) if bias else 0))


@VARIANTS
def test_weight_diff_oc_does_not_depend_on_the_tasks(variant):
    """The image groups' sums meet in a fixed order: the same bits for any split into runs of tiles (threads),
    over more images than a group's float32 sums hold (25 images of 100 positions: groups of 10)."""
    g = dict(N=25, G=1, cg=2, og=9, kh=3, kw=3, ph=1, pw=1, H=10, W=10, seed=11)
    x, w, b, dy, args = _arrays(g)
    got = []
    for tasks in (1, 3, 50):
        dw, db = np.zeros(w.shape, np.float32), np.zeros(b.shape, np.float32)
        with pytest.MonkeyPatch.context() as mp, kernel_variant(variant):
            mp.setattr(cd, "WO_TASKS_PER_THREAD", tasks)
            cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), dw.reshape(-1), *args, bias_diff=db)
        got.append((dw, db))
    for dw, db in got[1:]:
        assert np.array_equal(dw, got[0][0]) and np.array_equal(db, got[0][1])
    dw, db = got[0]
    assert_close(dw, ref_weight(x, dy, 3, 3, 1, 1, 1), ref_weight(np.abs(x), np.abs(dy), 3, 3, 1, 1, 1))
    assert_close(db, dy.astype(np.float64).sum(axis=(0, 2, 3)), np.abs(dy).astype(np.float64).sum(axis=(0, 2, 3)))


@st.composite
def wide_geometries(draw):
    """Rows 1-40 wide (8, 13, 16 and 17 often: one or two AVX2 vectors, half of, one or just past one AVX-512
    vector), output channels 1-20 (past one 16-lane vector, off the 4-channel block), input channels 1-18."""
    group = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
    OW = draw(st.one_of(st.sampled_from([8, 13, 16, 17]), st.integers(1, 40)))
    W = max(1, OW + kw - 1 - 2 * pw)
    H = draw(st.integers(max(1, kh - 2 * ph), max(1, kh - 2 * ph) + 5))
    return dict(N=draw(st.integers(1, 2)), G=group, cg=draw(st.integers(1, 18)), og=draw(st.integers(1, 20)),
                kh=kh, kw=kw, ph=ph, pw=pw, H=H, W=W, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.skipif(not AVX512, reason=NO_AVX512)
@given(g=wide_geometries(), bias=st.booleans(), tile=st.integers(1, 6), run_bytes=st.sampled_from([1, 4 << 20]),
       oc_tiling=st.sampled_from([(512, 24 << 10), (8, 1), (16, 2000), (64, 1 << 20)]))
def test_avx512_gives_the_avx2_bits(g, bias, tile, run_bytes, oc_tiling):
    """Forward, bottom diff and weight diff (with the bias diff) of the AVX-512 variants: within the float32
    bound of the reference, and bit for bit the AVX2 variant's (the same FMAs in the same order), with tiles of
    1-6 vectors of 16 positions, channel runs of 4 or all channels (run_bytes 1: partial sums stored between
    runs), and the oc forward's chunks of 8-512 positions and of one input channel to all (its sums stored in
    its scratch between chunks)."""
    x, w, b, dy, args = _arrays(g)
    N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW = args
    got = {}
    for variant in ("avx2", "avx512", "avx512_pos"):
        y, dx = np.full(dy.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
        dw, db = np.ones(w.shape, np.float32), np.ones(b.shape, np.float32)
        cd.set_avx512_tile(tile)
        prev, prev512 = cd.set_run_bytes(run_bytes), cd.set_avx512_run_bytes(run_bytes)
        prev_oc = cd.set_oc_tiling(*oc_tiling)
        try:
            with kernel_variant(variant):
                cd.forward(x.reshape(-1), _pack(w, G), b if bias else None, y.reshape(-1), *args)
                cd.forward(dy.reshape(-1), _pack(w, G, flip=True), None, dx.reshape(-1),
                           N, Co, OH, OW, C, G, kh, kw, kh - 1 - ph, kw - 1 - pw, H, W)
                cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), dw.reshape(-1), *args,
                                      bias_diff=db if bias else None)
        finally:
            cd.set_avx512_tile(6)
            cd.set_run_bytes(prev)
            cd.set_avx512_run_bytes(prev512)
            cd.set_oc_tiling(*prev_oc)
        got[variant] = (y, dx, dw, db)
    y, dx, dw, db = got["avx512"]
    ref = ref_conv(x, w, ph, pw, G) + (b.reshape(1, -1, 1, 1) if bias else 0)
    bound = ref_conv(np.abs(x), np.abs(w), ph, pw, G) + (np.abs(b).reshape(1, -1, 1, 1) if bias else 0)
    assert_close(y, ref, bound)
    assert_close(dx, ref_data(dy, w, H, W, ph, pw, G), ref_data(np.abs(dy), np.abs(w), H, W, ph, pw, G))
    assert_close(dw, 1 + ref_weight(x, dy, kh, kw, ph, pw, G), 1 + ref_weight(np.abs(x), np.abs(dy), kh, kw, ph, pw, G))
    sums = dy.astype(np.float64).sum(axis=(0, 2, 3)) if bias else 0
    assert_close(db, 1 + sums, 1 + (np.abs(dy).astype(np.float64).sum(axis=(0, 2, 3)) if bias else 0))
    for a, c, d in zip(got["avx2"], got["avx512"], got["avx512_pos"]):
        assert np.array_equal(a, c) and np.array_equal(a, d)


@pytest.mark.skipif(not AVX512, reason=NO_AVX512)
@given(og=st.one_of(st.integers(1, 20), st.integers(30, 150)), cg=st.integers(1, 40), G=st.integers(1, 2),
       k=st.integers(1, 5), side=st.integers(1, 30), N=st.integers(1, 2), flip=st.booleans(),
       run_bytes=st.sampled_from([1, 4 << 20]), rule=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_oc_forward_gives_the_position_tiles_bits(og, cg, G, k, side, N, flip, run_bytes, rule, seed):
    """The oc forward over blocks of 1-3 vectors of 16 outputs (zero filters past the last output), planes up to
    30 x 30 (split into runs of positions between the threads at batch 1), channel runs of 4 or all, on every
    layer or where its rule takes it: bit for bit the position-vector forward's, and within the float32 bound
    of the reference (the flipped filters: a bottom diff with og and cg swapped)."""
    pad = k // 2
    g = dict(N=N, G=G, cg=cg, og=og, kh=k, kw=k, ph=pad, pw=pad, H=max(side, k - 2 * pad), W=max(side, k - 2 * pad),
             seed=seed)
    x, w, b, dy, args = _arrays(g)
    N, C, H, W, Co, G, kh, kw, ph, pw, OH, OW = args
    got = {}
    prev = cd.set_avx512_run_bytes(run_bytes)
    try:
        for variant in ("avx512", "avx512_pos"):
            with kernel_variant(variant, oc_rule=rule):
                if flip:
                    out = np.full(x.shape, np.nan, np.float32)
                    cd.forward(dy.reshape(-1), _pack(w, G, flip=True), None, out.reshape(-1),
                               N, Co, OH, OW, C, G, kh, kw, kh - 1 - ph, kw - 1 - pw, H, W)
                else:
                    out = np.full(dy.shape, np.nan, np.float32)
                    cd.forward(x.reshape(-1), _pack(w, G), b, out.reshape(-1), *args)
            got[variant] = out
    finally:
        cd.set_avx512_run_bytes(prev)
    assert np.array_equal(got["avx512"], got["avx512_pos"])
    if flip:
        assert_close(got["avx512"], ref_data(dy, w, H, W, ph, pw, G), ref_data(np.abs(dy), np.abs(w), H, W, ph, pw, G))
    else:
        bound = ref_conv(np.abs(x), np.abs(w), ph, pw, G) + np.abs(b).reshape(1, -1, 1, 1)
        assert_close(got["avx512"], ref_conv(x, w, ph, pw, G) + b.reshape(1, -1, 1, 1), bound)


@pytest.mark.skipif(not AVX512, reason=NO_AVX512)
def test_oc_forward_from_two_python_threads():
    """The oc forward keeps its scratch per Python thread: two threads running layers of different sizes at
    once (each growing its own scratch) get the results one thread gets."""
    import threading
    geoms = [dict(N=1, G=1, cg=40, og=70, kh=3, kw=3, ph=1, pw=1, H=15, W=17, seed=3),
             dict(N=2, G=2, cg=20, og=33, kh=5, kw=5, ph=2, pw=2, H=9, W=30, seed=4)]
    cases = []
    for g in geoms:
        x, w, b, dy, args = _arrays(g)
        with kernel_variant("avx512"):
            packed = _pack(w, g["G"])
            ref = np.empty(dy.size, np.float32)
            cd.forward(x.reshape(-1), packed, b, ref, *args)
        cases.append((x, packed, b, args, ref))
    errors = []

    def run(case):
        x, packed, b, args, ref = case
        try:
            for _ in range(20):
                y = np.full(ref.size, np.nan, np.float32)
                cd.forward(x.reshape(-1), packed, b, y, *args)
                assert np.array_equal(y, ref)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    with kernel_variant("avx512"):
        threads = [threading.Thread(target=run, args=(c,)) for c in cases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_oc_tiling_setting_is_checked():
    with pytest.raises(ValueError, match="multiple of 8"):
        cd.set_oc_tiling(12, 1024)
    with pytest.raises(ValueError, match="multiple of 8"):
        cd.set_oc_tiling(0, 1024)
    prev = cd.set_oc_tiling(64, 1)
    assert cd.set_oc_tiling(*prev) == (64, 1)


def test_avx512_setting_is_checked():
    """AVX512 = True where the CPU has no AVX-512F raises instead of running illegal instructions; the tile
    setting takes 1-6 vectors."""
    with pytest.raises(ValueError, match="1 to 6 vectors"):
        cd.set_avx512_tile(7)
    if AVX512:
        pytest.skip("this CPU has AVX-512F (the error is for CPUs without)")
    x, w, b, dy, args = _arrays(dict(N=1, G=1, cg=2, og=3, kh=3, kw=3, ph=1, pw=1, H=4, W=5, seed=2))
    with kernel_variant("avx512"), pytest.raises(RuntimeError, match="no AVX-512F"):
        cd.forward(x.reshape(-1), _pack(w, 1), None, np.empty(dy.size, np.float32), *args)


def test_pack_layouts():
    w = np.arange(6 * 2 * 2 * 3, dtype=np.float32).reshape(6, 2, 2, 3)  # G = 2: og 3, cg 2
    with kernel_variant("avx2"):
        p, f = _pack(w, 2), _pack(w, 2, flip=True)
    assert p.shape == (2 * 1 * 4 * 2 * 2 * 3,)
    blocks = p.reshape(2, 1, 2, 2, 3, 4)  # [g][block][c][i][j][4 channels]
    assert np.array_equal(blocks[1, 0, :, :, :, :3], w[3:].transpose(1, 2, 3, 0))
    assert np.all(blocks[..., 3] == 0)  # the block's missing 4th channel: zero filters
    f = f.reshape(2, 1, 3, 2, 3, 4)  # adjoint: 2 (= cg) outputs from 3 (= og) inputs
    assert np.array_equal(f[0, 0, :, :, :, :2], w[:3, :, ::-1, ::-1].transpose(0, 2, 3, 1))


def test_bad_calls_raise_clear_errors():
    x, w, b, dy, args = _arrays(dict(N=2, G=1, cg=3, og=5, kh=3, kw=3, ph=1, pw=1, H=6, W=7, seed=1))
    p = _pack(w, 1)
    y = np.empty(dy.size, np.float32)
    with pytest.raises(ValueError, match="output size does not match"):
        cd.forward(x.reshape(-1), p, None, y, *args[:-1], 9)
    with pytest.raises(ValueError, match="group must divide"):
        cd.forward(x.reshape(-1), p, None, y, 2, 3, 6, 7, 5, 2, 3, 3, 1, 1, 6, 7)
    with pytest.raises(ValueError, match="image or output buffer too small"):
        cd.forward(x.reshape(-1)[:-1], p, None, y, *args)
    with pytest.raises(ValueError, match="packed filter buffer too small"):
        cd.forward(x.reshape(-1), p[:-1], None, y, *args)
    with pytest.raises(ValueError, match="bias buffer too small"):
        cd.forward(x.reshape(-1), p, b[:-1], y, *args)
    with pytest.raises(ValueError, match="weight diff buffer too small"):
        cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), np.zeros(w.size - 1, np.float32), *args)
    with pytest.raises(ValueError, match="bias diff buffer too small"):
        cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), np.zeros(w.size, np.float32), *args,
                              bias_diff=b[:-1].copy())
    with pytest.raises(ValueError, match="image or diff buffer too small"):
        cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1)[:-1], np.zeros(w.size, np.float32), *args)
    with pytest.raises(ValueError, match="packed buffer too small"):
        cd.pack_weights(w.reshape(-1), p[:-1], 1, 5, 3, 3, 3)
    with pytest.raises(ValueError, match="sizes must be positive"):
        cd.forward(x.reshape(-1), p, None, y, *args[:8], -1, *args[9:])


# -- the layer's dense plan ---------------------------------------------------------------------------

def _layer_products(text, shape, dense, deconv=False, seed=3):
    """top, bottom diff and parameter diffs of one Forward + two Backwards (parameter diffs accumulate),
    with conv_cpu.DENSE = dense ("batched": the generic path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_base, "CPU_PATHS", dense != "batched")
        mp.setattr(conv_cpu, "DENSE", "off" if dense == "batched" else dense)
        context.set_random_seed(seed)
        layer = make_layer("Deconvolution" if deconv else "Convolution", f"convolution_param {{ {text} {FILL} }}")
        rng = np.random.default_rng(seed)
        bottom = blobs_from_arrays([rng.normal(size=shape)], np.float32)
        top = empty_tops(1, np.float32)
        layer.SetUp(bottom, top)
        plan = layer.plan(np, np.float32)
        layer.Forward(bottom, top)
        top[0].diff[...] = rng.normal(size=top[0].shape)
        for b in layer.blobs:
            b.diff[...] = 0.25
        layer.Backward(top, [True], bottom)
        layer.Backward(top, [True], bottom)
        return plan, [top[0].data.copy(), bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]


@pytest.mark.skipif(not SUPPORTED, reason="the dense plan needs AVX2 and FMA")
@pytest.mark.parametrize("text,shape", [
    ("num_output: 6 kernel_size: 5 pad: 2", (3, 4, 9, 11)),                   # same padding: all three dense
    ("num_output: 6 kernel_h: 5 kernel_w: 3 pad_h: 1 pad_w: 2 group: 2", (2, 6, 7, 13)),  # data blocked
    ("num_output: 10 kernel_size: 4", (2, 3, 6, 9)),                           # pad 0 (dense only when "on")
])
@pytest.mark.parametrize("deconv", [False, True])
@pytest.mark.parametrize("mode", ["on", "auto"])
@VARIANTS
def test_dense_plan_matches_the_batched_path(text, shape, deconv, mode, variant):
    with kernel_variant(variant):
        plan, got = _layer_products(text, shape, mode, deconv)
    _, ref = _layer_products(text, shape, "batched", deconv)
    assert plan == ("blocked" if mode == "auto" and "pad" not in text else "dense")
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


ALL = ("fwd", "wgt", "data")


@pytest.mark.skipif(not SUPPORTED, reason="the dense plan needs AVX2 and FMA")
@pytest.mark.parametrize("text,shape,avx2,avx512,blas512_avx2,blas512_avx512", [
    ("num_output: 32 kernel_size: 5 pad: 2", (2, 3, 32, 32), ALL, ALL, ALL, ALL),   # CIFAR10-quick conv1
    ("num_output: 32 kernel_size: 5 pad: 2", (2, 32, 16, 16), ALL, ALL, ALL, ALL),  # conv2
    ("num_output: 64 kernel_size: 5 pad: 2", (2, 32, 8, 8), ALL, ALL, ALL, ALL),    # conv3 (8x8: the AVX2 rule)
    ("num_output: 50 kernel_size: 5", (2, 20, 12, 12), (), (), (), ()),            # LeNet conv2: sgemm
    ("num_output: 384 kernel_size: 3 pad: 1", (1, 256, 13, 13), (), ALL, (), ("fwd",)),  # CaffeNet conv3
    ("num_output: 256 kernel_size: 5 pad: 2 group: 2", (1, 96, 27, 27), (), ALL, (), ("fwd", "data")),  # conv2
    ("num_output: 384 kernel_size: 3 pad: 1 group: 2", (1, 384, 13, 13), (), ALL, (), ("fwd", "data")),  # conv4
    ("num_output: 64 kernel_size: 3 pad: 1", (2, 64, 56, 56), ALL, ALL, ALL, ALL),  # ResNet-50 res2
    ("num_output: 128 kernel_size: 3 pad: 1", (2, 128, 28, 28), (), ALL, (), ("fwd", "data")),  # ResNet res3
    ("num_output: 64 kernel_size: 3 pad: 1", (1, 64, 56, 56), ALL, ALL, ALL, ()),  # res2 at batch 1: blocked
    ("num_output: 128 kernel_size: 3 pad: 1", (1, 128, 28, 28), (), ALL, (), ()),  # res3 at batch 1 (BLAS512)
    ("num_output: 256 kernel_size: 3 pad: 1", (1, 256, 14, 14), (), ALL, (), ("fwd",)),  # ResNet-50 res4
    ("num_output: 512 kernel_size: 3 pad: 1", (1, 512, 7, 7), (), (), (), ()),    # ResNet-50 res5: 7x7 planes
    ("num_output: 512 kernel_size: 3 pad: 1", (1, 256, 14, 14), (), ("data",), (), ()),  # past 384 outputs
    ("num_output: 20 kernel_size: 5", (2, 1, 28, 28), (), (), (), ()),            # LeNet conv1: exact path
    ("num_output: 8 kernel_size: 3 stride: 2 pad: 1", (2, 16, 9, 9), (), (), (), ()),  # stride 2
    ("num_output: 8 kernel_size: 3 dilation: 2", (2, 16, 9, 9), (), (), (), ()),  # dilated
])
@pytest.mark.parametrize("variant", ["avx2", "avx512"])
@pytest.mark.parametrize("blas512", [False, True])
def test_dense_rule(text, shape, avx2, avx512, blas512_avx2, blas512_avx512, variant, blas512):
    """The measured rule for each kernel variant, with NumPy's OpenBLAS on AVX2 kernels and on its AVX-512 ones
    (BLAS512) (the rule only reads cd.AVX512 and conv_cpu.BLAS512: no kernel runs here, so every rule is checked
    on any CPU)."""
    products = {(False, "avx2"): avx2, (False, "avx512"): avx512, (True, "avx2"): blas512_avx2,
                (True, "avx512"): blas512_avx512}[blas512, variant]
    layer = make_layer("Convolution", f"convolution_param {{ {text} }}")
    layer.SetUp(blobs_from_arrays([np.zeros(shape)], np.float32), empty_tops(1, np.float32))
    with kernel_variant(variant), pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_cpu, "BLAS512", blas512)
        assert conv_cpu.dense_products(layer, np.float32) == products
        assert layer.plan(np, np.float32) == ("dense" if products else "blocked")
        assert conv_cpu.dense_products(layer, np.float64) == ()  # float64 keeps the other plans
        mp.setattr(conv_cpu, "DENSE", "off")
        assert layer.plan(np, np.float32) == "blocked"


def test_blas512_names_openblas_avx512_kernels():
    """BLAS512 says whether NumPy's OpenBLAS runs its AVX-512 sgemm kernels (its core name), in a fresh process
    under OPENBLAS_CORETYPE=Haswell (AVX2 kernels: False) and SkylakeX (where the CPU has AVX-512)."""
    import os
    import subprocess
    import sys
    from caffe.layers import _cpu
    code = "from caffe.layers import conv_cpu; print(conv_cpu.BLAS512, conv_cpu.blas_corename())"
    cores = ["Haswell"] + (["SkylakeX"] if _cpu.cpu_has_avx512() else [])
    for core in cores:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "OPENBLAS_CORETYPE": core}).stdout.split()
        if out[1] == "None":
            pytest.skip("NumPy's BLAS is not an OpenBLAS that names its core")
        assert out == [str(core == "SkylakeX"), core], out


@VARIANTS
def test_weight_diff_over_many_images(variant):
    """More images than one float32 accumulation holds (8): the groups' sums meet in float64."""
    g = dict(N=19, G=1, cg=2, og=5, kh=3, kw=3, ph=1, pw=0, H=5, W=9, seed=7)
    x, w, b, dy, args = _arrays(g)
    dw = np.zeros(w.shape, np.float32)
    with kernel_variant(variant):
        cd.backward_weight_oc(x.reshape(-1), dy.reshape(-1), dw.reshape(-1), *args)
    assert_close(dw, ref_weight(x, dy, 3, 3, 1, 0, 1), ref_weight(np.abs(x), np.abs(dy), 3, 3, 1, 0, 1))
