"""kernels.normalization's streaming and blocked paths (BatchNorm with batch statistics, LRN across channels) in
every build: the non-temporal stores and the prefetching forced on small shapes against the NumPy reference and
against the in-cache code (the same bits), the channel groups with the next channel prefetched, LRN's blocks per
channel step and its equal pieces, odd and tiny sizes, float32 and float64, in place where Caffe allows it."""
import contextlib
import os
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers import _cpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the helper module kernels_harness
from kernels_harness import BUILDS, DTYPES, arrays, build_module, check_paths, layers_use  # noqa: E402

SEEDS = st.integers(0, 2**31 - 1)
# (N, C, S): tiny and odd (scalar heads and tails around the 16 / 32 / 64-byte vector stores), channel groups
# with and without a remainder (C past 8 and 4 per thread), LRN's blocks of 256 (forward) and 64 or 128 (backward:
# scale read or recomputed) positions with remainders, pieces of a plane cut for the threads (past 32768 elements of
# work: both threads)
NCS = [(1, 1, 1), (2, 3, 5), (1, 9, 17), (3, 13, 67), (2, 33, 65), (1, 4, 300), (2, 5, 257), (1, 6, 3001),
       (3, 17, 130), (2, 3, 4099)]


@contextlib.contextmanager
def stream_from(nbytes, *mods, prefetch=None):
    """`mods` (and the layers' build) stream outputs of at least nbytes (0: always) inside the block, and prefetch
    (LRN: by blocks) from `prefetch` bytes (0: always) where given."""
    mods = {m for m in (*mods, _cpu.normalization) if m is not None}
    old = {m: (m._set_stream_min_bytes(nbytes),
               m._set_prefetch_min_bytes(prefetch) if prefetch is not None else None) for m in mods}
    try:
        yield
    finally:
        for m, (v, p) in old.items():
            m._set_stream_min_bytes(*v)
            if p is not None:
                m._set_prefetch_min_bytes(p)


NEVER = 1 << 62


def _cases(max_n=3, max_c=20, max_s=400):
    small = st.tuples(st.integers(1, max_n), st.integers(1, max_c), st.integers(1, max_s))
    return st.one_of(small, st.sampled_from(NCS))


def _bn_all(mod, x, dy, N, C, S, eps=1e-5):
    """Every BatchNorm kernel call on the same inputs: forward out of place, in place with x_norm, backward from
    x, from x_norm, and in place (dx over dy)."""
    e = np.empty(0, x.dtype)
    y, xn, x2 = np.empty_like(x), np.empty_like(x), x.copy()
    m, v, m2, v2 = np.zeros(C), np.zeros(C), np.zeros(C), np.zeros(C)
    mod.batch_norm_train_forward(x, y, e, m, v, N, C, S, eps)
    mod.batch_norm_train_forward(x2, x2, xn, m2, v2, N, C, S, eps)
    mean, inv = m.astype(x.dtype), (1 / np.sqrt(v + eps)).astype(x.dtype)
    dx, dx2, dy3 = np.empty_like(x), np.empty_like(x), dy.copy()
    mod.batch_norm_train_backward(dy, e, x, mean, inv, dx, N, C, S)
    mod.batch_norm_train_backward(dy, xn, e, mean, inv, dx2, N, C, S)
    mod.batch_norm_train_backward(dy3, xn, e, mean, inv, dy3, N, C, S)
    return dict(y=y, in_place=x2, x_norm=xn, mean=m, var=v, mean2=m2, var2=v2, dx=dx, dx_xn=dx2, dx_in_place=dy3)


@pytest.mark.parametrize("build", BUILDS)
@given(ncs=_cases(), dtype=DTYPES, seed=SEEDS, offset=st.sampled_from([0.0, 50.0]))
def test_batch_norm_streaming_is_the_cached_bits_and_matches_numpy(build, ncs, dtype, seed, offset):
    mod = build_module("normalization", build)
    N, C, S = ncs
    x = (arrays(seed, N * C * S) * 3 + offset).astype(dtype)
    dy = arrays(seed + 1, N * C * S).astype(dtype)
    with stream_from(0, mod):  # streamed, the next channel prefetched (small blobs: prefetch forced below)
        got = _bn_all(mod, x, dy, N, C, S)
    with stream_from(NEVER, mod, prefetch=0):
        prefetched = _bn_all(mod, x, dy, N, C, S)
    with stream_from(NEVER, mod, prefetch=NEVER):
        want = _bn_all(mod, x, dy, N, C, S)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        np.testing.assert_array_equal(prefetched[key], want[key], err_msg=key)
    # in place is the out-of-place top, its x_norm a copy; both forwards the same statistics
    for a, b in (("in_place", "y"), ("x_norm", "y"), ("mean2", "mean"), ("var2", "var"), ("dx_in_place", "dx_xn")):
        np.testing.assert_array_equal(got[a], got[b], err_msg=f"{a} vs {b}")
    # the NumPy reference: statistics in double; y from the kernel's own statistics in x's precision (the same
    # IEEE operations: the same bits); dx by the definition, within float rounding of the summed means
    x3, dy3 = x.reshape(N, C, S).astype(np.float64), dy.reshape(N, C, S).astype(np.float64)
    mean, var = x3.mean(axis=(0, 2)), x3.var(axis=(0, 2))
    rtol = 2e-5 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got["mean"], mean, rtol=rtol, atol=rtol * (3 + offset))
    np.testing.assert_allclose(got["var"], var, rtol=rtol * 10, atol=rtol * 10)
    m, inv = got["mean"].astype(dtype), (1 / np.sqrt(got["var"] + 1e-5)).astype(dtype)
    y_ref = (x.reshape(N, C, S) - m[None, :, None]) * inv[None, :, None]
    np.testing.assert_array_equal(got["y"], y_ref.ravel())
    # dx by the definition from the forward's x_norm (the top just checked: float32 x_norm near a large mean is
    # only as exact as x - mean in float32, which the kernel's backward recomputes the same way); within the
    # rounding of the two means in x's precision, relative to |dy| * inv_std
    xn, inv64 = got["y"].reshape(N, C, S).astype(np.float64), inv.astype(np.float64)[None, :, None]
    dx_ref = (dy3 - dy3.mean(axis=(0, 2), keepdims=True) - xn * (dy3 * xn).mean(axis=(0, 2), keepdims=True)) * inv64
    r = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got["dx"], dx_ref.ravel(), rtol=r,
                               atol=r * float((np.abs(dy3) * inv64).max()) * max(1.0, float(np.abs(xn).max())))


@pytest.mark.parametrize("in_place", [False, True])
@given(shape=st.sampled_from([(2, 3, 4, 5), (3, 9, 5, 7), (1, 17, 3, 3), (2, 5, 67, 11)]), dtype=DTYPES,
       seed=SEEDS)
def test_batch_norm_layer_streaming_matches_numpy(in_place, shape, dtype, seed):
    """The layer (in place: x_norm kept and streamed) through the streaming kernels of the build it loaded, by the
    CPU path and both mixed paths, against the NumPy path."""
    x, dy = arrays(seed, shape) * 2 + 10, arrays(seed + 1, shape)
    with stream_from(0):
        check_paths("BatchNorm", "batch_norm_param { moving_average_fraction: 0.9 }", [x], [dy], dtype,
                    in_place=in_place, rtol=1e-4 if dtype == np.float32 else None)


def lrn_reference(x, dy, size, alpha, beta, k):
    """Caffe's LRN across channels and its gradient on (N, C, S), by the definition (zero-padded windows)."""
    N, C, S = x.shape
    r = (size - 1) // 2

    def window(v):
        p = np.pad(v, ((0, 0), (r, r), (0, 0)))
        return sum(p[:, o:o + C] for o in range(size))

    scale = k + alpha / size * window(x * x)
    y = x * scale ** -beta
    dx = dy * scale ** -beta - 2 * alpha * beta / size * x * window(dy * y / scale)
    return scale, y, dx


def _lrn_all(mod, x, dy, N, C, S, size, alpha, k, beta):
    y, sc, yv, dx, dy2 = np.empty_like(x), np.empty_like(x), np.empty_like(x), np.empty_like(x), dy.copy()
    mod.lrn_across_forward(x, y, sc, N, C, S, size, alpha, k, beta)
    mod.lrn_across_forward(x, yv, None, N, C, S, size, alpha, k, beta)
    mod.lrn_across_backward(x, y, sc, dy, dx, N, C, S, size, alpha, beta)
    mod.lrn_across_backward(x, y, sc, dy2, dy2, N, C, S, size, alpha, beta)  # dx over dy: each row read first
    # the scale recomputed from x in the backward's pass (what the layer's CPU path runs), out of and in place
    dxr, dy3 = np.empty_like(x), dy.copy()
    mod.lrn_across_backward(x, y, None, dy, dxr, N, C, S, size, alpha, beta, k=k)
    mod.lrn_across_backward(x, y, None, dy3, dy3, N, C, S, size, alpha, beta, k=k)
    return dict(y=y, scale=sc, y_alone=yv, dx=dx, dx_in_place=dy2, dx_recomputed=dxr, dx_recomputed_in_place=dy3)


@pytest.mark.parametrize("build", BUILDS)
@given(ncs=_cases(), dtype=DTYPES, seed=SEEDS, size=st.sampled_from([1, 3, 5, 7]), beta=st.sampled_from([0.75, 0.6]),
       k=st.sampled_from([1.0, 2.0]))
def test_lrn_streaming_is_the_cached_bits_and_matches_numpy(build, ncs, dtype, seed, size, beta, k):
    mod = build_module("normalization", build)
    N, C, S = ncs
    alpha = 0.7
    x, dy = arrays(seed, N * C * S).astype(dtype), arrays(seed + 1, N * C * S).astype(dtype)
    with stream_from(0, mod):  # streamed, by blocks
        got = _lrn_all(mod, x, dy, N, C, S, size, alpha, k, beta)
    with stream_from(NEVER, mod, prefetch=0):  # by blocks, stored in cache
        blocks = _lrn_all(mod, x, dy, N, C, S, size, alpha, k, beta)
    with stream_from(NEVER, mod, prefetch=NEVER):  # one block a step
        want = _lrn_all(mod, x, dy, N, C, S, size, alpha, k, beta)
    # beta 0.75 is square roots and a division (IEEE: the same bits wherever the blocks cut the vector loops);
    # another beta calls pow, libmvec's in the vector loops and libm's in their scalar tails (within a few ulps)
    def same(a, b, what):
        if beta == 0.75:
            np.testing.assert_array_equal(a, b, err_msg=what)
        else:
            r = 4e-7 if dtype == np.float32 else 2e-15
            np.testing.assert_allclose(a, b, rtol=r, atol=r * max(1.0, float(np.abs(b).max())), err_msg=what)
    for key in want:
        same(got[key], want[key], key)
        same(blocks[key], want[key], key)
    np.testing.assert_array_equal(got["scale"], want["scale"])  # no pow in it
    np.testing.assert_array_equal(blocks["scale"], want["scale"])
    same(got["y_alone"], got["y"], "y alone")
    same(got["dx_in_place"], got["dx"], "dx in place")
    # recomputing the scale gives the kept scale's bits, so the same dx (beta 0.75: the same bits)
    same(got["dx_recomputed"], got["dx"], "dx, scale recomputed")
    same(got["dx_recomputed_in_place"], got["dx"], "dx in place, scale recomputed")
    sc, y, dx = lrn_reference(x.reshape(N, C, S).astype(np.float64), dy.reshape(N, C, S).astype(np.float64),
                              size, alpha, beta, k)
    rtol = 2e-5 if dtype == np.float32 else 1e-11
    for key, ref in (("scale", sc), ("y", y), ("dx", dx), ("dx_recomputed", dx)):
        np.testing.assert_allclose(got[key], ref.ravel(), rtol=rtol, atol=rtol * max(1.0, float(np.abs(ref).max())),
                                   err_msg=key)


@given(shape=st.sampled_from([(2, 3, 4, 5), (1, 9, 17, 19), (2, 7, 3, 101), (1, 3, 300, 2)]), dtype=DTYPES,
       seed=SEEDS, size=st.sampled_from([3, 5]))
def test_lrn_layer_streaming_matches_numpy(shape, dtype, seed, size):
    """The layer through the streaming kernels of the build it loaded, by the CPU path and both mixed paths."""
    text = f"lrn_param {{ local_size: {size} alpha: 0.3 beta: 0.75 k: 2 }}"
    with stream_from(0):
        check_paths("LRN", text, [arrays(seed, shape)], [arrays(seed + 1, shape)], dtype)


@pytest.mark.parametrize("n, s, threads, piece", [
    (8, 12544, 2, 3136),   # MobileNet's plane: four equal pieces, not three of 4096 and one of 256
    (8, 3136, 2, 3136),    # ResNet's: one piece per image
    (9, 4550, 2, 2288),    # two pieces (2288 + 2262)
    (1, 600, 2, 256),      # batch 1: cut for the threads, no shorter than 256
    (1, 5000, 2, 640),     # batch 1: eight pieces for two threads, whole cache lines
    (2, 10, 2, 10),        # a plane shorter than the minimum: one piece
])
def test_lrn_pieces_are_equal_and_whole_lines(n, s, threads, piece):
    from caffe.layers.kernels import normalization
    assert normalization._lrn_piece_for_tests(n, s, threads) == piece


def test_stream_and_prefetch_switches_round_trip():
    from caffe.layers.kernels import normalization
    old, old_p = normalization._set_stream_min_bytes(0), normalization._set_prefetch_min_bytes(5)
    try:
        assert normalization._lrn_prefetch_min_bytes_for_tests() == (5, 5)  # LRN's sizes follow the switch
        assert normalization._set_stream_min_bytes(1 << 20, 1 << 19) == (0, 0)
        assert normalization._set_stream_min_bytes(12 << 20) == (1 << 20, 1 << 19)
        assert normalization._set_stream_min_bytes(*old) == (12 << 20, 4 << 20)  # the defaults
        assert normalization._set_prefetch_min_bytes(old_p) == 5 and old_p == 1 << 20
        # ... and the default restores LRN's own (larger: blobs read from L3 go unblocked)
        assert normalization._lrn_prefetch_min_bytes_for_tests() == (9 << 19, 3 << 20)
    finally:
        normalization._set_stream_min_bytes(*old)
        normalization._set_prefetch_min_bytes(old_p)


def _bn_stats_reference(x3):
    """BatchNorm's statistics of (N, C, S) in the kernel's order of operations, in NumPy (so exactly its bits): per
    channel, K its first value; per image, the first S - S % 8 positions in blocks of 128 (the last one shorter),
    each block summed in x's precision over 8 lanes (lane j: positions = j mod 8, one vector step after another) of
    d = x - K and d * d, the blocks' lanes added into double totals in block order; the last S % 8 positions in
    double into lane 0; mean = K + s / m, var = q / m - (s / m)^2 (0 if below)."""
    N, C, S = x3.shape
    dt = x3.dtype.type
    S8 = S - S % 8
    means, variances = np.zeros(C), np.zeros(C)
    for c in range(C):
        k = x3[0, c, 0]
        sd, qd = [0.0] * 8, [0.0] * 8
        for n in range(N):
            p = x3[n, c]
            for b0 in range(0, S8, 128):
                blk = p[b0:min(b0 + 128, S8)].reshape(-1, 8)
                vs, vq = np.zeros(8, dt), np.zeros(8, dt)
                for row in blk:
                    v = row - k
                    vs = vs + v
                    vq = vq + v * v
                for j in range(8):
                    sd[j] += float(vs[j])
                    qd[j] += float(vq[j])
            for i in range(S8, S):
                d = float(p[i]) - float(k)
                sd[0] += d
                qd[0] += d * d
        s = q = 0.0
        for j in range(8):
            s += sd[j]
            q += qd[j]
        m = float(N * S)
        means[c] = float(k) + s / m
        variances[c] = max(q / m - (s / m) * (s / m), 0.0)
    return means, variances


@pytest.mark.parametrize("build", BUILDS)
@given(n=st.integers(1, 2), c=st.integers(1, 3), blocks=st.integers(0, 9), rest=st.integers(0, 127),
       dtype=DTYPES, seed=SEEDS, in_place=st.booleans(), offset=st.sampled_from([0.0, 50.0]))
def test_batch_norm_statistics_are_the_block_order_bits(build, n, c, blocks, rest, dtype, seed, in_place, offset):
    """The forward's statistics (the kernel sums four blocks of 128 side by side, then the rest block by block) are
    bit for bit those of the blocks taken one after another in NumPy (_bn_stats_reference), at every count of whole
    blocks (0-9: runs of four and what remains) and any remainder (shorter last block, S % 8 tail), in every build,
    float32 and float64, in place (with x_norm) or not; the top is (x - mean) * inv_std from them, bit for bit."""
    mod = build_module("normalization", build)
    S = 128 * blocks + rest
    if S == 0:
        S = 1
    x = (arrays(seed, (n, c, S)) * 3 + offset).astype(dtype)
    y, xn, m, v = np.empty_like(x), np.empty_like(x), np.zeros(c), np.zeros(c)
    if in_place:
        y[...] = x
        mod.batch_norm_train_forward(y.reshape(-1), y.reshape(-1), xn.reshape(-1), m, v, n, c, S, 1e-5)
    else:
        mod.batch_norm_train_forward(x.reshape(-1), y.reshape(-1), np.empty(0, dtype), m, v, n, c, S, 1e-5)
    mean, var = _bn_stats_reference(x)
    np.testing.assert_array_equal(m, mean)
    np.testing.assert_array_equal(v, var)
    mt, inv = mean.astype(dtype), (1 / np.sqrt(var + 1e-5)).astype(dtype)
    np.testing.assert_array_equal(y, (x - mt[None, :, None]) * inv[None, :, None])
    if in_place:
        np.testing.assert_array_equal(xn, y)
