"""kernels.elementwise against the layers' NumPy paths: neurons, Eltwise, Dropout, Concat/Slice/Split."""
import os
import sys

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.blob import context
from caffe.layers import _cpu
from caffe.layers.dropout import mask_reference, mask_threshold
from caffe.layers.kernels import elementwise
from caffe.layers.testing import blobs_from_arrays, empty_tops, make_layer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the helper module kernels_harness
from kernels_harness import (BUILDS, DTYPES, arrays, assert_close, build_module, check_paths, layers_use,  # noqa: E402
                             run, shapes)

# type, prototxt, input range, may run in place
NEURONS = [
    ("ReLU", "", (-2, 2), True),
    ("ReLU", "relu_param { negative_slope: 0.2 }", (-2, 2), True),
    ("Sigmoid", "", (-6, 6), True),
    ("TanH", "", (-4, 4), True),
    ("ELU", "elu_param { alpha: 0.7 }", (-3, 2), True),
    ("Swish", "swish_param { beta: 1.3 }", (-4, 4), True),
    ("BNLL", "", (-60, 60), True),
    ("AbsVal", "", (-2, 2), False),
    ("Clip", "clip_param { min: -0.5 max: 0.8 }", (-2, 2), True),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }", (-2, 2), True),
    ("Power", "power_param { power: 1.7 scale: 0.5 shift: 1.5 }", (-2, 2), True),
    ("Power", "power_param { power: -0.5 }", (0.2, 3), True),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 0.25 }", (-3, 3), True),
    ("Exp", "", (-3, 3), True),
    ("Log", "log_param { base: 10 scale: 2 shift: 5 }", (-2, 2), True),
    ("Log", "", (0.1, 3), True),
    ("Threshold", "threshold_param { threshold: 0.3 }", (-2, 2), True),
    ("Dropout", "dropout_param { dropout_ratio: 0.3 }", (-2, 2), True),
    ("Dropout", "dropout_param { dropout_ratio: 0.3 }", (-2, 2), False),
]


def test_operation_codes_match_the_kernel():
    for name in ("RELU", "SIGMOID", "TANH", "ELU", "POWER", "EXP", "LOG", "ABSVAL", "BNLL", "THRESHOLD", "CLIP",
                 "SWISH", "AFFINE"):
        assert int(getattr(elementwise.Neuron, name)) == getattr(_cpu, name), name


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("type_name, text, bounds, in_place_ok", NEURONS,
                         ids=[f"{t}-{i}" for i, (t, *_) in enumerate(NEURONS)])
@given(shape=shapes(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1), in_place=st.booleans())
def test_neuron_kernels_match_numpy(build, type_name, text, bounds, in_place_ok, shape, dtype, seed, in_place):
    """Every build (baseline, AVX2, AVX-512: libmvec's 2/4-, 8- or 16-wide exp, tanh, log, pow, each within 4 ulp
    of the correctly rounded result) against the NumPy reference within the harness's tolerance (float32 2e-5,
    float64 1e-11 relative to the reference's magnitude)."""
    in_place = in_place and in_place_ok
    x = arrays(seed, shape, *bounds)
    dy = arrays(seed + 1, shape)
    no_backward = type_name == "Threshold"
    with layers_use("elementwise", build_module("elementwise", build)):
        check_paths(type_name, text, [x], None if no_backward else [dy], dtype, in_place=in_place)


# The neuron ops whose kernels call libm (op, a, b, c, d) as the layers pass them, for the special values below
LIBM_OPS = [("Sigmoid", 1, 0, 0, 0, 0), ("TanH", 2, 0, 0, 0, 0), ("ELU", 3, 0.7, 0, 0, 0),
            ("Power", 4, 0.5, 1.5, 1.7, 0.85), ("Exp", 5, 0.5, 1.2, 0, 0), ("Log", 6, 2.0, 5.0, 0.4, 0.8),
            ("BNLL", 8, 0, 0, 0, 0), ("Swish", 11, 1.3, 0, 0, 0)]


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@pytest.mark.parametrize("name, op, a, b, c, d", LIBM_OPS, ids=[o[0] for o in LIBM_OPS])
@given(dtype=DTYPES, seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 3, 17, 33, 4099]))
def test_neuron_special_values_as_the_baseline_build(build, name, op, a, b, c, d, dtype, seed, n):
    """NaN, +-inf, +-0, denormals, huge and near-overflow inputs (mixed with ordinary ones, at every position of the
    vector loops and their tails): the SIMD builds give NaN / inf exactly where the baseline build (libmvec's SSE
    functions in its vector loops) does, and finite results within a few ulps of it (libmvec's functions are within 4 ulp; relative 2e-6 / 4e-15,
    and as much absolute where the formulas cancel)."""
    base, mod = build_module("elementwise", "base"), build_module("elementwise", build)
    rng = np.random.default_rng(seed)
    fi = np.finfo(dtype)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, fi.tiny / 4, -fi.tiny / 4, fi.max, -fi.max, 88.7, -88.7,
                        89.0, -104.0, 709.8, -745.2, 1e-30, 20.0, -20.0], dtype)
    x = rng.uniform(-5, 5, n).astype(dtype)
    pick = rng.random(n) < 0.5
    x[pick] = rng.choice(special, int(pick.sum()))
    dy = rng.uniform(-1, 1, n).astype(dtype)
    e = np.empty(0, dtype)
    outs = []
    for m in (base, mod):
        y, aux, dx = np.full_like(x, 7), np.full_like(x, 7), np.full_like(x, 7)
        with np.errstate(all="ignore"):
            m.neuron_forward(op, x, y, aux if op == 11 else e, e, a, b, c)
            m.neuron_backward(op, x, y, aux if op == 11 else e, dy, dx, a, b, c, d)
        outs.append((y, dx))
    r = 2e-6 if dtype == np.float32 else 4e-15
    for got, want, what in zip(outs[1], outs[0], ("forward", "backward")):
        assert np.array_equal(np.isnan(got), np.isnan(want)), (what, x[np.isnan(got) != np.isnan(want)])
        inf = np.isinf(want)
        np.testing.assert_array_equal(got[inf], want[inf], err_msg=what)
        fin = np.isfinite(want)
        # atol r: Sigmoid's 0.5 tanh(x / 2) + 0.5 (and Swish, BNLL) cancel near 0, where an ulp of the terms (~1) is
        # larger than one of the result
        np.testing.assert_allclose(got[fin], want[fin], rtol=r, atol=r, err_msg=what)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("name, op, a, b, c, d", LIBM_OPS, ids=[o[0] for o in LIBM_OPS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neuron_bits_do_not_depend_on_the_position(build, name, op, a, b, c, d, dtype):
    """The same input gives the same bits wherever it sits in the blob, forward and backward: every length 1-40 (each
    remainder of the vector loops), past a 4096-element piece (the threads' pieces' own remainders) and at ordinary,
    tiny (tanh x = x) and large values. GCC's vector body calls libmvec and its scalar remainder libm, which round
    differently (float32 tanh of -2.2757785e-4 was one ulp off in the remainder); the kernels run a piece's last
    elements through the vector loop, padded."""
    mod = build_module("elementwise", build)
    rng = np.random.default_rng(op)
    values = np.concatenate([rng.uniform(-4, 4, 6), rng.uniform(-3e-4, 3e-4, 3), [-2.2757785e-4, 0.37, 25.0]])
    if op == 6:  # Log of a x + b: positive
        values = np.abs(values) + 1e-3
    e = np.empty(0, dtype)
    for v in values.astype(dtype):
        first = None
        for n in list(range(1, 41)) + [4099, 4096 + 4096 + 19]:
            x, dy = np.full(n, v, dtype), np.full(n, dtype(0.625), dtype)
            y, aux, dx = np.empty(n, dtype), np.empty(n, dtype), np.empty(n, dtype)
            with np.errstate(all="ignore"):
                mod.neuron_forward(op, x, y, aux if op == 11 else e, e, a, b, c)
                mod.neuron_backward(op, x, y, aux if op == 11 else e, dy, dx, a, b, c, d)
            got = (y.view(np.uint32 if dtype == np.float32 else np.uint64),
                   dx.view(np.uint32 if dtype == np.float32 else np.uint64))
            if first is None:
                first = (got[0][0], got[1][0])
            for what, bits, want in zip(("forward", "backward"), got, first):
                moved = np.nonzero(bits != want)[0]
                assert moved.size == 0, f"{name} {what} of {v!r} at positions {moved[:8].tolist()} of {n}"


@pytest.mark.parametrize("type_name, text, bounds, in_place_ok", NEURONS,
                         ids=[f"{t}-{i}" for i, (t, *_) in enumerate(NEURONS)])
def test_neuron_cpu_path_without_the_kernels(type_name, text, bounds, in_place_ok, monkeypatch):
    """A source tree without the compiled kernels: forward_cpu / backward_cpu fall back to the NumPy path
    and compute the same (the dispatch itself: a fallback that is skipped leaves the top unwritten)."""
    x, dy = arrays(11, (2, 3, 5), *bounds), arrays(12, (2, 3, 5))
    dys = None if type_name == "Threshold" else [dy]
    ref = run(type_name, text, [x], dys, np.float32, in_place=in_place_ok)
    monkeypatch.setattr(_cpu, "elementwise", None)
    got = run(type_name, text, [x], dys, np.float32, in_place=in_place_ok)
    for key in ref:
        assert_close(got[key], ref[key], np.float32, what=f"{type_name} {key}")


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX"])
@given(shape=shapes(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1), k=st.integers(2, 4),
       coeff=st.booleans(), stable=st.booleans(), in_place=st.booleans(), which=st.integers(0, 3))
def test_eltwise_kernels_match_numpy(build, op, shape, dtype, seed, k, coeff, stable, in_place, which):
    """Eltwise forward and backward in each build (two bottoms with both diffs: SUM and stable PROD backward in one
    vector pass in the AVX2 / AVX-512 builds) against the NumPy path, in place too."""
    xs = [arrays(seed + i, shape, 0.2, 2) * np.where(arrays(seed + 9 + i, shape) > 0, 1, -1) for i in range(k)]
    if op == "MAX":  # ties: bottom[1] wins over bottom[0], later bottoms need strictly more
        xs[1].reshape(-1)[::3] = xs[0].reshape(-1)[::3]
    dy = arrays(seed + 7, shape)
    text = f"eltwise_param {{ operation: {op} stable_prod_grad: {str(stable).lower()} "
    if coeff and op == "SUM":
        text += " ".join(f"coeff: {c}" for c in (0.5, -1.5, 2.0, 0.25)[:k])
    text += " }"
    pd = [i != which for i in range(k)] if which < k else None
    with layers_use("elementwise", build_module("elementwise", build)):
        check_paths("Eltwise", text, xs, [dy], dtype, in_place=in_place, propagate_down=pd)


def _offset_view(rng, n, dtype, fill):
    """n elements of dtype starting 0-15 elements into a fresh buffer: every start within a 64-byte line."""
    off = int(rng.integers(0, 16))
    return np.full(n + 16, fill, dtype)[off:off + n]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("case", ["MAX forward", "MAX backward", "SUM backward", "PROD backward"])
@given(n=st.one_of(st.integers(1, 70), st.integers(4000, 9000)), dtype=DTYPES, seed=st.integers(0, 2**31 - 1),
       in_place=st.sampled_from([None, 0, 1]), stream=st.booleans())
@example(n=4103, dtype=np.float32, seed=3, in_place=0, stream=True)  # in place over several pieces, every profile
@example(n=4103, dtype=np.float64, seed=4, in_place=1, stream=True)
def test_eltwise_two_bottoms_streaming_is_the_numpy_result(build, case, n, dtype, seed, in_place, stream):
    """The two-bottom passes (MAX forward: top and mask; MAX, SUM and stable PROD backward: both diffs), streaming
    (threshold 0: the AVX2 / AVX-512 builds' non-temporal stores, each output from its own first 64-byte line) or
    not, against NumPy bit for bit (selects keep -0 and NaN where chosen; the products round once, as NumPy's):
    sizes within one piece and over several (CHUNK 4096: the pieces' heads and tails), every start within a line
    for each input and output (the two outputs' lines apart), and in place (the top is a bottom, or a diff is the
    top diff)."""
    mod = build_module("elementwise", build)
    rng = np.random.default_rng(seed)

    def values(fill_special):
        v = _offset_view(rng, n, dtype, 0)
        v[:] = rng.standard_normal(n)
        if fill_special:
            v[rng.random(n) < 0.1] = -0.0
            v[rng.random(n) < 0.05] = np.nan
        return v

    x0, x1, dy = values(case.startswith("MAX")), values(case.startswith("MAX")), values(True)
    if case == "MAX forward":
        x1[::5] = x0[::5]  # ties: bottom[1] wins
        want = [np.where(x0 > x1, x0, x1), np.where(x0 > x1, 0, 1).astype(np.int32)]
        outs = [_offset_view(rng, n, dtype, 7), _offset_view(rng, n, np.int32, 7)]
        if in_place is not None:
            outs[0] = (x0, x1)[in_place]
        call = (2, [x0, x1], np.empty(0), outs[0], outs[1])
    else:
        mask = _offset_view(rng, n, np.int32, 0)
        mask[:] = rng.integers(0, 2, n)
        coeff = np.array([0.5, -1.5]) if case == "SUM backward" else np.empty(0)
        if case == "MAX backward":
            want = [np.where(mask == i, dy, dtype(0)) for i in (0, 1)]
        elif case == "SUM backward":
            want = [dtype(c) * dy for c in coeff]
        else:
            want = [x1 * dy, x0 * dy]
        outs = [_offset_view(rng, n, dtype, 7) for _ in range(2)]
        if in_place is not None:
            outs[in_place] = dy
        op = {"MAX backward": 2, "SUM backward": 1, "PROD backward": 0}[case]
        call = (op, [x0, x1], outs, coeff, np.empty(0, dtype), dy, mask if op == 2 else mask[:0], True)
    old = mod._set_stream_min_bytes(0 if stream else 1 << 62)
    try:
        (mod.eltwise_forward if case == "MAX forward" else mod.eltwise_backward)(*call)
    finally:
        mod._set_stream_min_bytes(old)
    for got, ref in zip(outs, want):
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8), err_msg=case)


def test_eltwise_stream_threshold_hook():
    """The streaming threshold's hook returns the previous size; the default streams 25.7 MB ResNet / MobileNet
    diffs (8x256x56x56 float32) and not a 3.2 MB one."""
    old = elementwise._set_stream_min_bytes(0)
    try:
        assert elementwise._set_stream_min_bytes(5) == 0
        assert 8 * 64 * 28 * 28 * 4 < old <= 8 * 256 * 56 * 56 * 4
    finally:
        assert elementwise._set_stream_min_bytes(old) == 5


# 0.999999: the threshold is 2^16 (nothing kept), past the 16-bit compare
@given(n=st.integers(0, 20000), seed=st.integers(0, 2**64 - 1),
       ratio=st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.999999]), dtype=st.sampled_from([np.float32, np.float64]))
def test_dropout_mask_is_the_splitmix_reference(n, seed, ratio, dtype):
    thr = mask_threshold(ratio)
    mask = np.full(n, 7, np.uint8)
    elementwise.dropout_forward(np.empty(0, np.float32), np.empty(0, np.float32), mask, seed, thr, 1.0, False)
    ref = mask_reference(seed, n, thr)
    np.testing.assert_array_equal(mask, ref)
    x = np.random.default_rng(seed % 1000).standard_normal(n).astype(dtype)  # drawn and applied: the same mask
    y, mask2 = np.empty_like(x), np.full(n, 7, np.uint8)
    elementwise.dropout_forward(x, y, mask2, seed, thr, 2.5, True)
    np.testing.assert_array_equal(mask2, ref)
    np.testing.assert_array_equal(y, x * (ref * dtype(2.5)))


def test_dropout_mask_statistics_and_thread_independence():
    n = 1 << 20
    m1 = np.empty(n, np.uint8)
    elementwise.dropout_forward(np.empty(0), np.empty(0), m1, 12345, mask_threshold(0.3), 1.0, False)
    assert abs(m1.mean() - 0.7) < 0.002  # 1M draws: std of the kept fraction 0.0005
    # neighbours are independent: P(both kept) = 0.49
    assert abs((m1[1:] & m1[:-1]).mean() - 0.49) < 0.003
    x = np.arange(n, dtype=np.float32)
    y = np.empty_like(x)
    m2 = np.empty(n, np.uint8)
    elementwise.dropout_forward(x, y, m2, 12345, mask_threshold(0.3), 2.0, True)
    np.testing.assert_array_equal(m1, m2)  # the mask alone, or drawn and applied (both threads): the same
    np.testing.assert_array_equal(y, x * m1 * np.float32(2.0))


def _axis_shapes(max_dims=4):
    return shapes(min_dims=1, max_dims=max_dims, max_side=5, big=[(2, 6, 67, 101), (4, 40011)])


@given(shape=_axis_shapes(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1), data=st.data())
def test_concat_and_slice_kernels_match_numpy(shape, dtype, seed, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    pieces = []
    for i, s in enumerate(sizes):
        sh = list(shape)
        sh[axis] = s
        pieces.append(arrays(seed + i, sh))
    whole = np.concatenate(pieces, axis=axis)
    pd = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    ref = check_paths("Concat", f"concat_param {{ axis: {axis} }}", pieces, [arrays(seed + 5, whole.shape)], dtype,
                      propagate_down=pd)
    np.testing.assert_array_equal(ref["top"][0], whole.astype(dtype))
    points = " ".join(f"slice_point: {p}" for p in np.cumsum(sizes)[:-1])
    tops = [arrays(seed + 9 + i, p.shape) for i, p in enumerate(pieces)]
    ref = check_paths("Slice", f"slice_param {{ axis: {axis} {points} }}", [whole], tops, dtype, n_top=len(sizes))
    for got, piece in zip(ref["top"], pieces):
        np.testing.assert_array_equal(got, piece.astype(dtype))


@given(shape=shapes(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1), n_top=st.integers(2, 4))
def test_split_backward_kernel_matches_numpy(shape, dtype, seed, n_top):
    tops = [arrays(seed + i, shape) for i in range(n_top)]
    check_paths("Split", "", [arrays(seed, shape)], tops, dtype, n_top=n_top)


def test_in_place_layers_keep_their_state_in_blobs():
    """Backward's state is a Blob attribute (Caffe's names), not a NumPy one, whichever path ran forward."""
    x = arrays(0, (2, 3, 4))
    for type_name, text, attr in [("ELU", "", "bottom_memory_"), ("Dropout", "", "rand_vec_"),
                                  ("Swish", "", "sigmoid_output_"), ("Clip", "clip_param { min: 0 max: 1 }",
                                                                     "bottom_memory_"),
                                  ("Eltwise", "eltwise_param { operation: MAX }", "max_idx_")]:
        layer = make_layer(type_name, text)
        bottom = blobs_from_arrays([x, x[::-1].copy()] if type_name == "Eltwise" else [x])
        top = empty_tops(1) if type_name == "Eltwise" else bottom[:1]
        layer.SetUp(bottom, top)
        layer.Forward(bottom, top)
        from caffe.blob import Blob
        assert isinstance(getattr(layer, attr), Blob), (type_name, attr)


def test_kernels_refuse_short_buffers():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="top holds 5 elements, needs 10"):
        elementwise.neuron_forward(0, x, np.zeros(5, np.float32), np.empty(0, np.float32), np.empty(0, np.float32))
    with pytest.raises(ValueError, match=r"bottom\[1\] holds 3"):
        elementwise.eltwise_forward(1, [x, x[:3]], np.ones(2), np.zeros(10, np.float32), np.empty(0, np.int32))
    with pytest.raises(ValueError, match="destination holds"):
        elementwise.copy_rows(x, 0, 5, np.zeros(4, np.float32), 0, 5, 2, 5)


def test_relu_and_dropout_are_identical_on_cpu_and_reference_bit_for_bit():
    """Where no libm function is involved the kernel does the NumPy path's arithmetic exactly."""
    x = arrays(1, (3, 70000)).astype(np.float32)
    dy = arrays(2, x.shape).astype(np.float32)
    for type_name, text in [("ReLU", "relu_param { negative_slope: 0.1 }"), ("Dropout", ""), ("Eltwise", "")]:
        bottoms = [x, dy] if type_name == "Eltwise" else [x]
        context.set_random_seed(4)
        ref = check_paths(type_name, text, bottoms, [dy], np.float32, rtol=0)
        assert ref["top"][0].shape == x.shape


@pytest.mark.parametrize("build", BUILDS)
def test_bnll_float32_is_within_4_ulp_of_softplus(build):
    """BNLL's float32 forward, max(x, 0) + log1p(exp(-|x|)), against softplus in float64: within 4 ulp where the
    result is normal (libm's expf and log1pf: 3.1 measured; the AVX-512 build's series for log1p: 3.9; libmvec
    states 4 ulp for its functions), within 4 denormal spacings below; NaN, +-inf, +-0 as NumPy's softplus."""
    mod = build_module("elementwise", build)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-110, 110, 400_001), rng.standard_normal(100_000) * 8,
                        rng.uniform(-1.5, 1.5, 100_000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38]]).astype(np.float32)
    y = np.empty_like(x)
    e = np.empty(0, np.float32)
    mod.neuron_forward(_cpu.BNLL, x, y, e, e, 0, 0, 0)
    with np.errstate(invalid="ignore"):
        ref = np.logaddexp(0, x.astype(np.float64))
    tiny = np.finfo(np.float32).tiny
    normal = np.isfinite(ref) & (ref >= tiny)
    ulps = np.abs(y[normal] - ref[normal]) / np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 4, (ulps.max(), x[normal][ulps.argmax()])
    sub = np.isfinite(ref) & (ref < tiny)
    assert np.all(np.abs(y[sub] - ref[sub]) <= 4 * 2.0 ** -149)
    special = ~np.isfinite(x)
    np.testing.assert_array_equal(y[special], ref[special].astype(np.float32))
    assert y[x == 0][0] == np.float32(np.log(2.0))


def _ulps(got, ref):
    """|got - ref| in units of the float32 spacing at ref (ref float64, normal)."""
    return np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize("name, op, a", [("Sigmoid", 1, 0.0), ("Swish", 11, 1.3), ("BNLL", 8, 0.0)])
@given(n=st.integers(1, 70), seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1.0, 20.0, 110.0]),
       in_place=st.booleans())
def test_avx512_own_exp_loops_within_ulps_of_float64(name, op, a, n, seed, scale, in_place):
    """The AVX-512 build's own float32 Sigmoid / Swish / BNLL loops (VSCALEFPS exp; whole vectors, then a masked
    tail: any n) against float64: sigmoid and BNLL (forward and backward) within 3 ulp where the result is normal
    (2.3 / 2.4 / 2.1 measured), within FLT_MIN below; Swish's top is x * its sigmoid output as float32 rounds it;
    in place (the top over the bottom, the bottom diff over the top diff) the same bits; nothing written past n."""
    mod = build_module("elementwise", "avx512")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    dy = rng.uniform(-2, 2, n).astype(np.float32)
    e = np.empty(0, np.float32)
    buf = np.full(n + 17, 7, np.float32)  # the outputs are buf[:n]: the 17 past them must stay 7
    aux = np.full(n + 17, 7, np.float32)
    y = buf[:n]
    mod.neuron_forward(op, x, y, aux[:n] if op == _cpu.SWISH else e, e, a, 0, 0)
    assert np.all(buf[n:] == 7) and np.all(aux[n:] == 7)
    x64 = x.astype(np.float64)
    tiny = np.finfo(np.float32).tiny
    if op == _cpu.SWISH:
        t = (x * np.float32(a)).astype(np.float64)
        got, ref = aux[:n], 1 / (1 + np.exp(-t))
        np.testing.assert_array_equal(y, x * aux[:n])
    else:
        got, ref = y, (1 / (1 + np.exp(-x64)) if op == _cpu.SIGMOID else np.logaddexp(0, x64))
    normal = ref >= tiny
    assert np.all(_ulps(got[normal], ref[normal]) <= 3), (x[normal][_ulps(got[normal], ref[normal]).argmax()])
    assert np.all(np.abs(got[~normal] - ref[~normal]) <= tiny)
    if op == _cpu.BNLL:
        dx = np.full(n + 17, 7, np.float32)
        mod.neuron_backward(op, x, y, e, dy, dx[:n], 0, 0, 0, 0)
        assert np.all(dx[n:] == 7)
        dref = dy.astype(np.float64) / (1 + np.exp(-np.minimum(x64, 50)))
        big = np.abs(dref) >= tiny
        assert np.all(_ulps(dx[:n][big], dref[big]) <= 3.5)  # (dy * e rounds once more than the sigmoid)
        if in_place:
            d2 = dy.copy()
            mod.neuron_backward(op, x, y, e, d2, d2, 0, 0, 0, 0)
            np.testing.assert_array_equal(d2, dx[:n])
    if in_place:
        xi, ai = x.copy(), np.empty_like(x)
        mod.neuron_forward(op, xi, xi, ai if op == _cpu.SWISH else e, e, a, 0, 0)
        np.testing.assert_array_equal(xi, y)


def _exp_elu_log_ref(op, x, a, b, c=1.0):
    """In float64: Exp's exp(a x) b (a x rounded in float32, as the kernels and Caffe's caffe_cpu_scale round it),
    ELU's max(x, 0) + a expm1(min(x, 0)), Log's log(a x + b) c (a x + b rounded in float32), TanH's tanh x."""
    a32, b32, c32 = np.float32(a), np.float32(b), np.float32(c)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == _cpu.TANH:
            return np.tanh(x64)
        if op == _cpu.EXP:
            return np.exp((x * a32).astype(np.float64)) * np.float64(b32)
        if op == _cpu.ELU:
            return np.maximum(x64, 0) + np.float64(a32) * np.expm1(np.minimum(x64, 0))
        return np.log((x * a32 + b32).astype(np.float64)) * np.float64(c32)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("name, op", [("Exp", 5), ("ELU", 3), ("Log", 6), ("TanH", 2)])
def test_exp_elu_log_float32_within_ulps_of_float64(build, name, op):
    """Exp (y = exp(x)), ELU (alpha 1), Log (y = log(x)) and TanH float32 forward over [-110, 110] (Log: |x| and
    log-spaced positives down to the denormals) and the special values against float64: within 4 ulp where the
    result is normal in every build (libmvec states 4 ulp; measured over every 7th float32: its SSE / AVX2 expf
    2.9 / 2.6, logf 3.9 / 3.9, tanhf 1.03), within 1.5 ulp in the AVX-512 build's own loops (measured the same way:
    exp 0.88, ELU's expm1 1.23, log 0.82) but TanH's, within 2.5 (2.42 measured: e / (e + 2) rounds e + 2 near 0),
    within one denormal spacing below FLT_MIN; overflow to inf, NaN, +-inf, +-0 (log: -inf) and negative logs
    (NaN) as the baseline build gives them; TanH: x itself where |x| < 2^-12 (tanh x rounds to x there), as libm."""
    mod, base = build_module("elementwise", build), build_module("elementwise", "base")
    rng = np.random.default_rng(1)
    x = np.concatenate([np.linspace(-110, 110, 200_001), rng.standard_normal(50_000) * 3,
                        rng.uniform(-1e-3, 1e-3, 20_000), [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45,
                                                           3e38, -3e38, 88.72284, 88.72285, -87.33655, -103.97]])
    if op == _cpu.TANH:  # where tanh x rounds to +-1 (9.01), to x (2^-12), the VDIVPS form's worst (~0.0156)
        x = np.concatenate([x, np.linspace(-12, 12, 50_001), rng.uniform(0.0155, 0.0157, 20_000),
                            np.geomspace(1e-45, 1e-2, 20_000) * rng.choice([-1, 1], 20_000)])
    if op == _cpu.LOG:
        x = np.concatenate([np.abs(x), -x[:1000], np.geomspace(1e-45, 3e38, 100_000), [1.0, 2.0, 0.5, 1.17549435e-38]])
    x = x.astype(np.float32)
    e = np.empty(0, np.float32)
    y, y0 = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        mod.neuron_forward(op, x, y, e, e, 1.0, 0.0 if op == _cpu.LOG else 1.0, 1.0)
        base.neuron_forward(op, x, y0, e, e, 1.0, 0.0 if op == _cpu.LOG else 1.0, 1.0)
    ref = _exp_elu_log_ref(op, x, 1.0, 0.0 if op == _cpu.LOG else 1.0)
    tiny = np.finfo(np.float32).tiny
    normal = np.isfinite(ref) & (np.abs(ref) >= tiny) & (np.abs(ref) <= np.finfo(np.float32).max)
    bound = (2.5 if op == _cpu.TANH else 1.5) if build == "avx512" else 4
    u = _ulps(y[normal], ref[normal])
    assert u.max() <= bound, (u.max(), x[normal][u.argmax()])
    if op == _cpu.TANH:
        tiny_x = np.abs(x) < 2.0 ** -12
        np.testing.assert_array_equal(y[tiny_x], x[tiny_x])
        np.testing.assert_array_equal(y[tiny_x], y0[tiny_x])
    sub = np.isfinite(ref) & (np.abs(ref) < tiny)
    assert np.all(np.abs(y[sub] - ref[sub]) <= 2.0 ** -149)
    np.testing.assert_array_equal(y[ref == 0], 0)
    odd = ~np.isfinite(y0) | ~np.isfinite(x) | (x == 0)
    np.testing.assert_array_equal(y[odd], y0[odd])
    np.testing.assert_array_equal(np.signbit(y[odd]), np.signbit(y0[odd]))


@pytest.mark.parametrize("name, op", [("Exp", 5), ("ELU", 3), ("Log", 6), ("TanH", 2)])
@given(n=st.integers(1, 70), seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 20.0, 110.0]),
       abc=st.sampled_from([(1.0, 1.0, 1.0), (0.5, 1.2, 0.4), (0.35, 2.5, 1.0), (-1.7, 0.3, 2.0), (2.0, 5.0, 0.4343)]),
       in_place=st.booleans())
def test_avx512_own_exp_elu_log_loops_within_ulps_of_float64(name, op, n, seed, scale, abc, in_place):
    """The AVX-512 build's own float32 Exp (y = exp(a x) b), ELU (alpha a), Log (y = log(a x + b) c) and TanH
    (no parameters) loops, any n (whole vectors, then a masked tail), any parameters: within 2 ulp of float64 where
    the result is normal (0.88, 1.23, 0.82 ulp for the exp, expm1, log, half an ulp for the outer scale; Log's ref
    takes a x + b as float32 rounds it; TanH within 2.5, 2.42 measured), within 2 denormal spacings below FLT_MIN;
    in place the same bits; nothing written past n; the backward (no libm there) the baseline build's bits."""
    mod, base = build_module("elementwise", "avx512"), build_module("elementwise", "base")
    a, b, c = abc
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    dy = rng.uniform(-2, 2, n).astype(np.float32)
    e = np.empty(0, np.float32)
    buf = np.full(n + 17, 7, np.float32)
    y = buf[:n]
    with np.errstate(all="ignore"):
        mod.neuron_forward(op, x, y, e, e, a, b, c)
    assert np.all(buf[n:] == 7)
    ref = _exp_elu_log_ref(op, x, a, b, c)
    tiny = np.finfo(np.float32).tiny
    big = np.finfo(np.float32).max
    # Exp: exp(a x) is a float32 before the scale b: where it is denormal, its absolute error (one denormal spacing,
    # as expf's) comes out times b, and where it overflows the top is inf whatever b is (so in the baseline build too)
    inner = np.abs(ref) / abs(np.float32(b)) if op == _cpu.EXP else np.abs(ref)
    assert np.all(np.isinf(y[inner > big * (1 + 2.0 ** -24)]))
    normal = np.isfinite(ref) & (inner >= tiny) & (inner <= big) & (np.abs(ref) >= tiny) & (np.abs(ref) <= big)
    assert np.all(_ulps(y[normal], ref[normal]) <= (2.5 if op == _cpu.TANH else 2)), (
        x[normal][_ulps(y[normal], ref[normal]).argmax()])
    sub = np.isfinite(ref) & ~normal & (inner < tiny)
    spacing = 2.0 ** -149 * (1 + (abs(float(np.float32(b))) if op == _cpu.EXP else 1))
    assert np.all(np.abs(y[sub] - ref[sub]) <= spacing), (x[sub], y[sub], ref[sub])
    assert np.all(np.isinf(y[np.abs(ref) > big * (1 + 2.0 ** -24)]))
    dx, dx0 = np.full(n + 17, 7, np.float32), np.empty(n, np.float32)
    with np.errstate(all="ignore"):
        mod.neuron_backward(op, x, y, e, dy, dx[:n], a, b, c, a)
        base.neuron_backward(op, x, y, e, dy, dx0, a, b, c, a)
    assert np.all(dx[n:] == 7)
    np.testing.assert_array_equal(dx[:n], dx0)
    if in_place:
        xi = x.copy()
        with np.errstate(all="ignore"):
            mod.neuron_forward(op, xi, xi, e, e, a, b, c)
        np.testing.assert_array_equal(xi, y)


@pytest.mark.parametrize("build", BUILDS)
@given(shape=shapes(), dtype=DTYPES, seed=st.integers(0, 2**31 - 1), beta=st.sampled_from([1.0, 1.3, 0.25]),
       in_place=st.booleans())
def test_swish_recomputed_sigmoid_gives_the_kept_state_bits(build, shape, dtype, seed, beta, in_place):
    """The kernel's Swish without the sigmoid state (forward: the top only; backward: sigmoid(beta x) recomputed from
    the bottom) gives the top and bottom diff of its kept-state path (forward writing aux, backward reading it) bit
    for bit, in every build and precision, at any size (libmvec's vector body and scalar tail fall on the same
    elements in both loops). The layer takes that path out of place in float32 where the build says the sigmoid is
    cheap (AVX-512), leaving sigmoid_output_ alone, and keeps the state otherwise; the same bits either way. Both
    paths against the NumPy reference: test_neuron_kernels_match_numpy."""
    mod = build_module("elementwise", build)
    beta = float(np.float32(beta))  # (swish_param.beta is a float: what the layer passes)
    x = arrays(seed, shape, -6, 6).astype(dtype)
    dy = arrays(seed + 1, shape).astype(dtype)
    xf, dyf, e = x.reshape(-1), dy.reshape(-1), np.empty(0, dtype)
    y_ref, s_ref, dx_ref = np.empty_like(xf), np.empty_like(xf), np.empty_like(xf)
    mod.neuron_forward(_cpu.SWISH, xf, y_ref, s_ref, e, beta)
    mod.neuron_backward(_cpu.SWISH, e, y_ref, s_ref, dyf, dx_ref, beta)
    # the kernel's recomputing path in this build (the layer takes it where SWISH_RECOMPUTES_FLOAT32 says)
    y1, dx1 = np.full_like(xf, 7), np.full_like(xf, 7)
    mod.neuron_forward(_cpu.SWISH, xf, y1, e, e, beta)
    mod.neuron_backward(_cpu.SWISH, xf, y1, e, dyf, dx1, beta)
    np.testing.assert_array_equal(y1, y_ref)
    np.testing.assert_array_equal(dx1, dx_ref)
    recomputes = not in_place and dtype == np.float32 and mod.SWISH_RECOMPUTES_FLOAT32
    layer = make_layer("Swish", f"swish_param {{ beta: {beta} }}")
    bottom = blobs_from_arrays([x], dtype)
    top = bottom if in_place else empty_tops(1, dtype)
    with layers_use("elementwise", mod):
        layer.SetUp(bottom, top)
        layer.sigmoid_output_.data[...] = 7
        layer.Forward(bottom, top)
        np.testing.assert_array_equal(top[0].data.reshape(-1), y_ref)
        assert layer._sigmoid_kept == (not recomputes)
        if not recomputes:
            np.testing.assert_array_equal(layer.sigmoid_output_.data.reshape(-1), s_ref)
        else:
            assert np.all(layer.sigmoid_output_.data == 7)
        top[0].diff[...] = dy
        layer.Backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff.reshape(-1), dx_ref)
