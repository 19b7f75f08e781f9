"""kernels.softmax against the layers' NumPy paths: Softmax and SoftmaxWithLoss, any axis."""
import contextlib
import os
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.layers.kernels import softmax
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the helper module kernels_harness
from kernels_harness import (BUILDS, DTYPES, arrays, assert_close, build_module, check_paths, layers_use,  # noqa: E402
                             run, shapes)

SEEDS = st.integers(0, 2**31 - 1)
BIG = [(2, 5, 67, 101), (3, 40011), (70, 1000)]


@pytest.mark.parametrize("build", BUILDS)
@given(shape=shapes(big=BIG), dtype=DTYPES, seed=SEEDS, data=st.data(), spread=st.sampled_from([1.0, 40.0]))
def test_softmax_kernels_match_numpy(build, shape, dtype, seed, data, spread):
    """Every build (the AVX2 / AVX-512 ones: float32 exp by the FMA polynomial, within 1 ulp; float64 exp by
    libmvec, within 4 ulp) against the NumPy reference within the harness's tolerance, forward and backward."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = arrays(seed, shape) * spread  # a wide spread: exp would overflow without the max subtracted
    with layers_use("softmax", build_module("softmax", build)):
        got = check_paths("Softmax", f"softmax_param {{ axis: {axis} }}", [x], [arrays(seed + 1, shape)], dtype)
    np.testing.assert_allclose(got["top"][0].sum(axis=axis), 1, rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("build", BUILDS)
@given(shape=shapes(min_dims=2, big=BIG), dtype=DTYPES, seed=SEEDS, data=st.data(),
       norm=st.sampled_from(["FULL", "VALID", "BATCH_SIZE", "NONE"]), ignore=st.booleans(), two_tops=st.booleans())
def test_softmax_loss_kernels_match_numpy(build, shape, dtype, seed, data, norm, ignore, two_tops):
    axis = data.draw(st.integers(1, len(shape) - 1))  # the labels share the first axis
    c = shape[axis]
    labels = np.random.default_rng(seed).integers(0, c, shape[:axis] + shape[axis + 1:]).astype(np.float64)
    text = f"softmax_param {{ axis: {axis} }} loss_param {{ normalization: {norm} "
    if ignore:
        text += "ignore_label: 0 "
    text += "} loss_weight: 1"
    if two_tops:
        text += " loss_weight: 0"
    diffs = [np.array(1.7)] + ([np.zeros(shape)] if two_tops else [])
    with layers_use("softmax", build_module("softmax", build)):
        check_paths("SoftmaxWithLoss", text, [arrays(seed, shape) * 5, labels], diffs, dtype,
                    n_top=2 if two_tops else 1, propagate_down=[True, False])


@pytest.mark.parametrize("shape", [(2, 64, 2048 + 37), (1, 3, 2 * 43690 + 5)])
def test_several_pieces_per_row(shape):
    """Positions past one work item's piece (kernels.softmax PIECE / C; the last piece partial): forward,
    backward and the loss's per-piece sums as the NumPy paths compute them."""
    x, dy = arrays(5, shape) * 8, arrays(6, shape)
    ref = check_paths("Softmax", "", [x], [dy], np.float32, mixed=False)
    np.testing.assert_allclose(ref["top"][0].sum(axis=1), 1, rtol=1e-5)
    labels = np.random.default_rng(7).integers(0, shape[1], (shape[0], shape[2])).astype(np.float64)
    check_paths("SoftmaxWithLoss", "loss_param { ignore_label: 1 } loss_weight: 1", [x, labels], [np.array(1.3)],
                np.float32, mixed=False, propagate_down=[True, False])


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("inner", [1, 3, 37])
def test_softmax_loss_forward_kernel_clamps_and_keeps_nan(build, dtype, inner):
    """Caffe's -log(std::max(p, FLT_MIN)): a probability that underflows to 0 costs -log(FLT_MIN), NaN stays
    NaN; only valid positions count, and an out-of-range label is refused (not read out of bounds). Every build
    (the vector builds' float32 loss takes its logs by libmvec's logf, 16 or 8 positions at a time: 37 positions
    leave a tail)."""
    softmax = build_module("softmax", build)
    # (outer 2, C 2, inner): at every position class 0 has all the probability, class 1 none (exp(-200) = 0)
    x = np.zeros((2, 2, inner), dtype)
    x[:, 1] = -200
    prob = np.empty(x.size, dtype)
    label = np.zeros((2, inner), np.int64)
    label[0, 0] = 1  # p = 0 there: -log(FLT_MIN)
    valid = np.ones((2, inner), np.uint8)
    valid[1, 0] = 0
    got = softmax.softmax_loss_forward(x.ravel(), prob, label.ravel(), valid.ravel(), 2, 2, inner)
    np.testing.assert_allclose(prob.reshape(x.shape)[:, 0], 1)
    assert got == pytest.approx(-np.log(np.float64(np.finfo(np.float32).tiny)), rel=1e-6)
    label[1, 0] = 5  # where not valid, never read
    assert softmax.softmax_loss_forward(x.ravel(), prob, label.ravel(), valid.ravel(), 2, 2, inner) == got
    x[0, 1, 0] = np.nan
    assert np.isnan(softmax.softmax_loss_forward(x.ravel(), prob, label.ravel(), valid.ravel(), 2, 2, inner))
    valid[1, 0] = 1
    with pytest.raises(ValueError, match="label 5 out of range"):
        softmax.softmax_loss_forward(x.ravel(), prob, label.ravel(), valid.ravel(), 2, 2, inner)


@pytest.mark.parametrize("build", BUILDS)
def test_softmax_exp_is_within_an_ulp_or_two(build):
    """The exp the softmax kernels use on x - max <= 0 (the FMA kernel in the AVX2 and AVX-512 builds, libm's
    elsewhere): within 3 ulp of exp in float64 down to ln(FLT_MIN), 0 or a denormal below it, exp(0) = 1, NaN kept."""
    mod = build_module("softmax", build)
    rng = np.random.default_rng(0)
    x = -np.concatenate([np.linspace(0, 100, 200_001), rng.exponential(5, 100_000), [0.0, 1e-30, 87.3, 87.34, np.inf]])
    x = np.concatenate([x, [np.nan]]).astype(np.float32)
    y = np.empty_like(x)
    mod.exp_nonpositive(x, y)
    ref = np.exp(x.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny
    ulps = np.abs(y[normal] - ref[normal]) / np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 3
    below = ~normal & ~np.isnan(x)
    assert np.all((y[below] >= 0) & (y[below] < np.finfo(np.float32).tiny))
    assert y[x == 0][0] == 1 and np.isnan(y[-1])


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_bits_do_not_depend_on_the_position(build, dtype):
    # Every position holds the same channel vector: every position's probabilities and gradients the same bits, at
    # position counts with every remainder of the vector loops and several pieces. GCC's vector body calls libmvec and
    # its scalar remainder libm, which round differently: before the padded remainder 16-101 positions differed.
    rng = np.random.default_rng(4)
    with layers_use("softmax", build_module("softmax", build)):
        for n in (7, 43, 301, 4099):
            x = np.repeat((rng.standard_normal(8) * 3)[None, :, None], n, axis=2).reshape(1, 8, n, 1)
            for type_name in ("Softmax", "SoftmaxWithLoss"):
                layer = make_layer(type_name, "loss_param { normalization: NONE }" if type_name != "Softmax" else "")
                inputs = [x] if type_name == "Softmax" else [x, np.zeros((1, n, 1))]
                bottom, top = blobs_from_arrays(inputs, dtype), empty_tops(1, dtype)
                layer.SetUp(bottom, top)
                layer.Forward(bottom, top)
                top[0].diff[...] = 0.5 if type_name == "Softmax" else 1.0
                layer.Backward(top, [True] + [False] * (len(inputs) - 1), bottom)
                outs = ([top[0].data] if type_name == "Softmax" else []) + [bottom[0].diff]
                for a in outs:
                    moved = np.argwhere(a != a[..., :1, :])
                    assert moved.size == 0, f"{type_name} n {n}: positions {moved[:5, 2].tolist()} differ"


def test_softmax_kernels_refuse_short_buffers():
    x = np.zeros(12)
    with pytest.raises(ValueError, match="top holds 11"):
        softmax.softmax_forward(x, np.zeros(11), 2, 3, 2)
    with pytest.raises(ValueError, match="label holds 3"):
        softmax.softmax_loss_backward(x, np.zeros(3, np.int64), np.ones(4, np.uint8), np.zeros(12), 2, 3, 2, 1.0)


@pytest.mark.parametrize("type_name", ["Softmax", "SoftmaxWithLoss"])
def test_the_cpu_path_runs_the_kernels(type_name, monkeypatch):
    from caffe.layers import _cpu
    calls = []
    for name in ("softmax_forward", "softmax_backward", "softmax_loss_forward", "softmax_loss_backward"):
        real = getattr(_cpu.softmax, name)
        monkeypatch.setattr(_cpu.softmax, name, lambda *a, _r=real, _n=name: (calls.append(_n), _r(*a))[1])
    layer = make_layer(type_name)
    arrs = [arrays(0, (4, 5, 3))] + ([np.zeros((4, 3))] if type_name == "SoftmaxWithLoss" else [])
    bottom, top = blobs_from_arrays(arrs, np.float32), empty_tops(1, np.float32)
    layer.SetUp(bottom, top)
    layer.Forward(bottom, top)
    top[0].diff[...] = 1
    layer.Backward(top, [True, False][:len(bottom)], bottom)
    if type_name == "Softmax":
        assert calls == ["softmax_forward", "softmax_backward"]
    else:
        assert calls == ["softmax_loss_forward", "softmax_loss_backward"]  # the probabilities and the loss at once


@pytest.mark.parametrize("path", ["cpu", "xp"])
def test_softmax_subtracts_each_rows_own_max(path):
    """Rows 1000 apart: with one max over every row, exp of the lower row underflows (float64 too) to 0 / 0."""
    x = np.array([[0.0, 1.0, 2.0], [-1000.0, -999.0, -998.0]])
    got = run("Softmax", "", [x], [np.ones_like(x)], np.float64, fwd=path, bwd=path)
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(got["top"][0], np.stack([e / e.sum()] * 2), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_cpu_path_without_the_kernels(dtype, monkeypatch):
    """A source tree without the compiled kernels: Softmax's forward_cpu / backward_cpu fall back to NumPy."""
    from caffe.layers import _cpu
    x, dy = arrays(3, (2, 4, 3)) * 5, arrays(4, (2, 4, 3))
    ref = run("Softmax", "", [x], [dy], dtype)
    monkeypatch.setattr(_cpu, "softmax", None)
    got = run("Softmax", "", [x], [dy], dtype)
    for key in ref:
        assert_close(got[key], ref[key], dtype, what=f"Softmax {key}")


# -- the streaming paths (outputs of >= STREAM_MIN_BYTES: scratch block, non-temporal stores, runs of pieces
# with the next piece prefetched), switched on for small shapes by the kernels' test hook -----------------

@contextlib.contextmanager
def stream_from(nbytes, scratch_nbytes=None, mods=()):
    """The baseline build's, the layers' and `mods`' kernels stream outputs of at least nbytes (0: always) and
    (forward) use the scratch block from scratch_nbytes (default: nbytes) inside the block."""
    from caffe.layers import _cpu
    mods = {m for m in (softmax, _cpu.softmax, *mods) if m is not None}
    old = {m: m._set_stream_min_bytes(nbytes, scratch_nbytes) for m in mods}
    try:
        yield
    finally:
        for m, v in old.items():
            m._set_stream_min_bytes(*v)


# odd sizes: rows that start off the 32-byte boundary (scalar heads and tails around the vector stores); several
# pieces per row, partial last pieces, runs of pieces; C past 2 * PIECE / 64 (no scratch: in place)
STREAM_SHAPES = [(2, 5, 67, 101), (3, 257, 9, 61), (2, 64, 2048 + 37), (1, 4100, 70), (5, 3, 7)]


@pytest.mark.parametrize("build", BUILDS)
@given(shape=shapes(min_dims=2, big=STREAM_SHAPES), dtype=DTYPES, seed=SEEDS, data=st.data())
def test_streaming_softmax_matches_numpy_and_the_cached_path(build, shape, dtype, seed, data):
    """Forward and backward (also in place: dx = dy) through the streaming code of each build (the AVX2 / AVX-512
    builds' non-temporal vector stores): the NumPy reference within tolerance, and the same bits as the in-cache
    code on the same inputs."""
    mod = build_module("softmax", build)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x, dy = arrays(seed, shape) * 8, arrays(seed + 1, shape)
    a = axis % len(shape)
    outer, c, inner = int(np.prod(shape[:a])), shape[a], int(np.prod(shape[a + 1:]))
    xf, dyf = x.astype(dtype).ravel(), dy.astype(dtype).ravel()
    y_s, dx_s, y_c, dx_c, y_n = (np.empty_like(xf) for _ in range(5))
    in_place = dyf.copy()
    with layers_use("softmax", mod), stream_from(0, mods=[mod]):
        check_paths("Softmax", f"softmax_param {{ axis: {axis} }}", [x], [dy], dtype, mixed=False)
        mod.softmax_forward(xf, y_s, outer, c, inner)
        mod.softmax_backward(y_s, dyf, dx_s, outer, c, inner)
        mod.softmax_backward(y_s, in_place, in_place, outer, c, inner)
    with stream_from(1 << 62, mods=[mod]):
        mod.softmax_forward(xf, y_c, outer, c, inner)
        mod.softmax_backward(y_c, dyf, dx_c, outer, c, inner)
    with stream_from(1 << 62, 0, mods=[mod]):  # the scratch block with normal stores
        mod.softmax_forward(xf, y_n, outer, c, inner)
    np.testing.assert_array_equal(y_n, y_c)
    np.testing.assert_array_equal(y_s, y_c)
    np.testing.assert_array_equal(dx_s, dx_c)
    np.testing.assert_array_equal(in_place, dx_c)


@pytest.mark.parametrize("build", BUILDS)
@given(shape=shapes(min_dims=2, big=STREAM_SHAPES), dtype=DTYPES, seed=SEEDS, data=st.data(),
       norm=st.sampled_from(["FULL", "VALID", "BATCH_SIZE", "NONE"]), ignore=st.sampled_from([None, 0, 2, -1]))
def test_streaming_softmax_loss_matches_numpy(build, shape, dtype, seed, data, norm, ignore):
    mod = build_module("softmax", build)
    axis = data.draw(st.integers(1, len(shape) - 1))
    c = shape[axis]
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, shape[:axis] + shape[axis + 1:]).astype(np.float64)
    text = f"softmax_param {{ axis: {axis} }} loss_param {{ normalization: {norm} "
    if ignore is not None:
        labels.flat[rng.integers(0, labels.size, max(1, labels.size // 4))] = ignore
        text += f"ignore_label: {ignore} "
    with layers_use("softmax", mod), stream_from(0, mods=[mod]):
        check_paths("SoftmaxWithLoss", text + "} loss_weight: 1", [arrays(seed, shape) * 5, labels],
                    [np.array(0.7)], dtype, mixed=False, propagate_down=[True, False])


# -- the labels: kernels.softmax.loss_labels against read_labels (the NumPy path's conversion) ----------------

@pytest.mark.parametrize("build", BUILDS)
@given(n=st.integers(0, 300), c=st.integers(1, 9), dtype=DTYPES, seed=SEEDS,
       ignore=st.sampled_from([None, 0, 3, -1, -4, 255]), bad=st.booleans(), edges=st.booleans())
def test_loss_labels_match_read_labels(build, n, c, dtype, seed, ignore, bad, edges):
    """Caffe's static_cast<int> (truncation: 2.7 -> 2, -0.5 -> 0), the ignore_label compared after it, the count
    of valid labels and the first bad one (out of [0, C), NaN, huge) in flat order, as read_labels finds it; in
    every build (the vector builds compare the value against the intervals that truncate to a class or to the
    ignore_label: `edges` puts values at and next to those intervals' ends, in the label's precision)."""
    from caffe.layers.softmax_loss import read_labels
    mod = build_module("softmax", build)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, c, n) + rng.choice([0.0, 0.0, 0.4, 0.99, -0.6], n)
    if ignore is not None and n:
        raw[rng.integers(0, n, max(1, n // 5))] = ignore
    raw = raw.astype(dtype)
    if edges and n:
        ends = np.array([-1, 0, 1, c - 1, c] + ([ignore - 1, ignore, ignore + 1] if ignore is not None else []), dtype)
        near = np.concatenate([ends, np.nextafter(ends, dtype(np.inf)), np.nextafter(ends, dtype(-np.inf)),
                               ends + dtype(0.5), ends - dtype(0.5)])
        raw[rng.integers(0, n, max(1, n // 3))] = rng.choice(near, max(1, n // 3))
    if bad and n:
        raw[rng.integers(0, n, 3)] = rng.choice([c, c + 0.5, -1.0, -7.0, np.nan, 1e30, -np.inf], 3)
    label, valid = np.full(n, 99, np.int64), np.full(n, 7, np.uint8)
    count, first = mod.loss_labels(raw, c, ignore is not None, ignore if ignore is not None else 0, label, valid)

    class Blob1:  # what read_labels reads: data_xp
        def data_xp(self, xp):
            return raw

    layer = make_layer("SoftmaxWithLoss")
    with np.errstate(invalid="ignore"):
        ints = raw.astype(np.int64)
    ok = ints != ignore if ignore is not None else np.ones(n, bool)
    bad_mask = ok & ((ints < 0) | (ints >= c))
    assert first == (int(np.flatnonzero(bad_mask)[0]) if bad_mask.any() else -1)
    assert count == int(ok.sum())
    np.testing.assert_array_equal(valid, ok.astype(np.uint8))
    np.testing.assert_array_equal(label, np.where(ok & ~bad_mask, ints, 0))
    if not bad_mask.any():
        with np.errstate(invalid="ignore"):
            _, v_ref, safe_ref = read_labels(layer, np, Blob1(), (n,), c, ignore)
        np.testing.assert_array_equal(valid, v_ref.astype(np.uint8))
        np.testing.assert_array_equal(label, safe_ref)


def test_softmax_loss_layer_names_the_first_bad_label():
    """The CPU path's error (from loss_labels' first bad index) names the same value as the NumPy path's."""
    x = arrays(1, (2, 3, 4))
    labels = np.zeros((2, 4))
    labels[0, 2], labels[1, 1] = 7.5, -2  # flat order: 7.5 first
    for path in ("cpu", "xp"):
        with pytest.raises(Exception, match=r"label value 7\.5 is out of range"):
            run("SoftmaxWithLoss", "", [x, labels], None, np.float32, fwd=path)


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(outer=st.integers(1, 3), c=st.integers(1, 40), inner=st.integers(1, 40), seed=SEEDS,
       spread=st.sampled_from([1.0, 40.0]), stream=st.booleans())
def test_softmax_float32_within_a_few_ulp_of_float64(build, outer, c, inner, seed, spread, stream):
    """The float32 forward of the vector builds (the max and exp passes by whole vectors of positions and a masked
    tail, the rows' exp in blocks; the AVX-512 build's VSCALEFPS exp) against softmax in float64 of x - max (rounded
    to float32 as the kernels take it): relative 1.5e-6
    (the exp's ulp, 16 channels summed in float32 before double: up to 15 roundings of the partial sum, the divisor
    rounded, the division), FLT_MIN absolute where the probability underflows; the loss from those probabilities."""
    mod = build_module("softmax", build)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(outer * c * inner) * spread).astype(np.float32)
    y = np.empty_like(x)
    with stream_from(0 if stream else 1 << 62, mods=[mod]):
        mod.softmax_forward(x, y, outer, c, inner)
    x3 = x.reshape(outer, c, inner)
    # x - max as float32 rounds it (as in any float32 softmax, Caffe's too: 3.8e-6 relative at exp(-65)), the rest exact
    e = np.exp((x3 - x3.max(axis=1, keepdims=True)).astype(np.float64))
    ref = (e / e.sum(axis=1, keepdims=True)).ravel()
    np.testing.assert_allclose(y, ref, rtol=1.5e-6, atol=np.finfo(np.float32).tiny)
    label = rng.integers(0, c, outer * inner).astype(np.int64)
    valid = (rng.random(outer * inner) < 0.8).astype(np.uint8)
    prob = np.empty_like(x)
    with stream_from(0 if stream else 1 << 62, mods=[mod]):
        loss = mod.softmax_loss_forward(x, prob, label, valid, outer, c, inner)
    np.testing.assert_array_equal(prob, y)
    # the loss: the vector builds' logs by libmvec's logf (within 4 ulp), the sums in double
    p = prob.reshape(outer, c, inner)[np.arange(outer)[:, None], label.reshape(outer, inner), np.arange(inner)]
    terms = -np.log(np.maximum(p, np.finfo(np.float32).tiny).astype(np.float64)).ravel()
    assert loss == pytest.approx(terms[valid == 1].sum(), rel=1e-6, abs=1e-6)


@contextlib.contextmanager
def sub_pieces(mod, elements, min_positions):
    old = mod._set_sub_piece(elements, min_positions)
    try:
        yield
    finally:
        mod._set_sub_piece(*old)


@pytest.mark.parametrize("build", BUILDS)
@given(outer=st.integers(1, 3), c=st.integers(1, 70), inner=st.integers(2, 300), seed=SEEDS, dtype=DTYPES,
       sub=st.sampled_from([(1, 1), (64, 16), (256, 16), (1000, 40)]), stream=st.sampled_from([0, 1 << 62]),
       spread=st.sampled_from([1.0, 40.0]))
def test_sub_pieces_give_the_pieces_bits(build, outer, c, inner, seed, dtype, sub, stream, spread):
    """The forward's passes by sub-pieces (vector builds, float32, scratch block) and the backward's pieces of that
    length, cut small by the test hook (several a piece, a partial last one; the prefetch of the next sub-piece
    within a piece and across pieces): the same probabilities, loss (the label probabilities of all of a piece's
    sub-pieces summed as one piece) and gradients, bit for bit, as the uncut pieces (these small shapes are under
    SUB_MIN positions: one sub-piece a piece), on the streamed and the scratch-with-normal-stores paths; the
    float64 and baseline loops, which take no sub-pieces in the forward, as well. And the NumPy reference."""
    mod = build_module("softmax", build)
    rng = np.random.default_rng(seed)
    n = outer * c * inner
    x = (rng.standard_normal(n) * spread).astype(dtype)
    dy = rng.standard_normal(n).astype(dtype)
    label = rng.integers(0, c, outer * inner).astype(np.int64)
    valid = (rng.random(outer * inner) < 0.8).astype(np.uint8)
    label[valid == 0] = rng.integers(-2**40, 2**40, int((valid == 0).sum()))  # never read
    out = []
    for cut in (None, sub):
        y, prob, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        with stream_from(stream, 0, mods=[mod]), (sub_pieces(mod, *cut) if cut else contextlib.nullcontext()):
            mod.softmax_forward(x, y, outer, c, inner)
            loss = mod.softmax_loss_forward(x, prob, label, valid, outer, c, inner)
            mod.softmax_backward(y, dy, dx, outer, c, inner)
        out.append((y, prob, loss, dx))
    (y0, p0, l0, dx0), (y1, p1, l1, dx1) = out
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(p1, y0)
    np.testing.assert_array_equal(dx1, dx0)
    assert l1 == l0
    # the reference as in test_softmax_float32_within_a_few_ulp_of_float64: x - max rounded in x's type, the rest
    # in float64; the loss from the kernel's probabilities (libmvec's logf within 4 ulp, the sums in double)
    x3 = x.reshape(outer, c, inner)
    e = np.exp((x3 - x3.max(axis=1, keepdims=True)).astype(np.float64))
    ref = e / e.sum(axis=1, keepdims=True)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(y0, ref.ravel(), rtol=tol, atol=np.finfo(dtype).tiny)
    p = y0.reshape(outer, c, inner)[np.arange(outer)[:, None], np.where(valid == 1, label, 0).reshape(outer, inner),
                                    np.arange(inner)]
    terms = -np.log(np.maximum(p, np.finfo(np.float32).tiny).astype(np.float64)).ravel()  # (Caffe's FLT_MIN)
    assert l0 == pytest.approx(terms[valid == 1].sum(), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@given(outer=st.integers(1, 3), c=st.integers(1, 70), inner=st.integers(1, 80), seed=SEEDS,
       stream=st.sampled_from([0, 1 << 62]), specials=st.booleans())
def test_vector_label_gather_is_the_scalar_loops_bits(build, outer, c, inner, seed, stream, specials):
    """SoftmaxWithLoss's label probabilities by masked gathers (16 or 8 positions at a time, the rest by the
    scalar loop) give the scalar loop's loss bit for bit: not-valid positions (their labels, junk here, never
    used), probabilities clamped to FLT_MIN (x spread wide) and NaN (a NaN in x) as the scalar loop has them."""
    mod = build_module("softmax", build)
    rng = np.random.default_rng(seed)
    n = outer * c * inner
    x = (rng.standard_normal(n) * (200.0 if specials else 3.0)).astype(np.float32)
    if specials:
        x[rng.integers(0, n)] = np.nan
    label = rng.integers(0, c, outer * inner).astype(np.int64)
    valid = (rng.random(outer * inner) < 0.7).astype(np.uint8) * rng.integers(1, 256, outer * inner).astype(np.uint8)
    label[valid == 0] = rng.integers(-2**40, 2**40, int((valid == 0).sum()))
    losses = []
    for vec in (False, True):
        prob = np.empty_like(x)
        old = mod._set_vector_gather(vec)
        try:
            with stream_from(stream, 0, mods=[mod]):
                losses.append(mod.softmax_loss_forward(x, prob, label, valid, outer, c, inner))
        finally:
            mod._set_vector_gather(old)
    np.testing.assert_array_equal(np.float64(losses[1]), np.float64(losses[0]))  # (NaN equals NaN here)
