"""kernels.rng (the gaussian fill) against caffe.layers.filler.gaussian_reference, and the reference against
NumPy's own log / sqrt / cos / sin and the normal distribution.

The kernel and the reference compute every value by the same IEEE operations in the same order, so they
must agree bit for bit, in every build (baseline, AVX2, AVX-512) and for any count and thread split. The
reference's polynomials are then checked against libm on the same uniforms (a wrong coefficient, quadrant
or exponent shows there), and its values against the normal distribution (Kolmogorov-Smirnov, moments,
independence of neighbours and of the two values of a pair).
"""
import importlib
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.blob import context
from caffe.layers import _cpu, filler
from caffe.layers.filler import filler_param, gaussian_reference

rng_kernel = pytest.importorskip("caffe.layers.kernels.rng")

SEEDS = st.integers(0, 2**63 - 1)


def _builds():
    mods = [rng_kernel]
    for suffix, ok in (("avx2", _cpu.cpu_has_avx2()), ("avx512", _cpu.cpu_has_avx512())):
        if ok:
            mods.append(importlib.import_module(f"caffe.layers.kernels.rng_{suffix}"))
    return mods


@given(seed=SEEDS, n=st.sampled_from([0, 1, 2, 3, 255, 512, 513, 8191, 8192, 8193, 20001]),
       mean=st.floats(-10, 10), std=st.floats(0, 10))
def test_every_build_is_the_reference_bit_for_bit(seed, n, mean, std):
    ref = gaussian_reference(seed, n, mean, std)
    for mod in _builds():
        out = np.empty(n)
        mod.gaussian_fill(out, seed, mean, std)
        np.testing.assert_array_equal(out.view(np.uint64), ref.view(np.uint64), err_msg=mod.__name__)
        out32 = np.empty(n, np.float32)
        mod.gaussian_fill(out32, seed, mean, std)
        np.testing.assert_array_equal(out32, ref.astype(np.float32), err_msg=mod.__name__)


@given(seed=SEEDS, first=st.integers(0, 40), n=st.integers(0, 40))
def test_the_reference_from_any_offset_is_a_slice_of_the_whole(seed, first, n):
    whole = gaussian_reference(seed, first + n)
    np.testing.assert_array_equal(gaussian_reference(seed, n, first=first), whole[first:])


def _libm_box_muller(a, b):
    """The pairs from words a, b by NumPy's log, sqrt, cos and sin (u1 = 1 - (a >> 12) / 2^52, u2 = (b >> 12) /
    2^52, converted from integers: another route to the same uniforms)."""
    u1 = 1.0 - (a >> np.uint64(12)).astype(np.float64) * 2.0 ** -52
    u2 = (b >> np.uint64(12)).astype(np.float64) * 2.0 ** -52
    r = np.sqrt(-2.0 * np.log(u1))
    return np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1).reshape(-1)


@given(seed=SEEDS)
def test_the_polynomials_are_libms_box_muller(seed):
    a, b = filler.splitmix_words(seed, 0, 4096)
    np.testing.assert_allclose(filler.box_muller_reference(a, b), _libm_box_muller(a, b), rtol=0, atol=2e-14)


def _words(tops):
    return np.array([t << 12 for t in tops], dtype=np.uint64)


# the uniforms' ends and the quarters' boundaries: u1 = 1 (r = 0) and 2^-52 (the largest r, sqrt(104 ln 2));
# u2 = 0, 1/8, 3/8, 5/8, 7/8 (where the nearest quarter changes, on either side) and 1 - 2^-52
EDGE_A = [0, 1, (1 << 51), (1 << 52) - 2, (1 << 52) - 1]
EDGE_B = [0, 1, (1 << 49) - 1, 1 << 49, 3 << 49, (3 << 49) - 1, 5 << 49, (5 << 49) + 1, 7 << 49, (7 << 49) - 1,
          (1 << 52) - 1, 1 << 50, 1 << 51, 3 << 50]


def test_the_edges_of_the_uniforms_in_every_build():
    a = _words([x for x in EDGE_A for _ in EDGE_B])
    b = _words([y for _ in EDGE_A for y in EDGE_B])
    ref = filler.box_muller_reference(a, b)
    np.testing.assert_allclose(ref, _libm_box_muller(a, b), rtol=0, atol=2e-14)
    assert np.all(ref[: 2 * len(EDGE_B)] == 0.0)  # u1 = 1
    radius = np.hypot(ref[0::2], ref[1::2])
    assert radius.max() <= math.sqrt(104 * math.log(2)) + 1e-14
    for mod in _builds():
        out = np.empty(2 * len(a))
        mod.box_muller(a, b, out)
        np.testing.assert_array_equal(out.view(np.uint64), ref.view(np.uint64), err_msg=mod.__name__)
    with pytest.raises(ValueError, match="box_muller: 3 and 2 words for 6 values"):
        rng_kernel.box_muller(a[:3], b[:2], np.empty(6))


def _normal_cdf(x):
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def test_the_values_are_normal():
    n = 200_000
    z = gaussian_reference(20261203, n)
    assert abs(z.mean()) < 5 * n ** -0.5
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2.0 / n)
    assert abs(np.mean(z ** 3)) < 5 * math.sqrt(15.0 / n)  # skew
    assert abs(np.mean(z ** 4) - 3.0) < 5 * math.sqrt(96.0 / n)  # kurtosis
    s = np.sort(z)
    cdf = _normal_cdf(s)
    i = np.arange(1, n + 1)
    d = max((i / n - cdf).max(), (cdf - (i - 1) / n).max())
    assert d < 1.95 / math.sqrt(n)  # Kolmogorov-Smirnov at 0.1%
    # neighbours (within a pair and across pairs) uncorrelated; the pair's radii and angles independent
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / math.sqrt(n)
    assert abs(np.corrcoef(z[0::2] ** 2, z[1::2] ** 2)[0, 1]) < 5 / math.sqrt(n / 2)
    # every tail by counts: P(|z| > 3) = 0.0026998
    assert abs(np.mean(np.abs(z) > 3) - 0.0026998) < 5 * math.sqrt(0.0027 / n)


def test_seeds_give_different_streams_and_neighbouring_seeds_do_not_overlap():
    a, b = gaussian_reference(1, 1000), gaussian_reference(2, 1000)
    assert not np.intersect1d(a, b).size
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


def test_the_fillers_use_the_kernel_and_the_fallback_gives_the_same_values(monkeypatch):
    """gaussian and msra fill from one seed drawn from the runtime generator; without the kernels (a source tree
    without the build) the reference fills the same values, in chunks."""
    from caffe.blob import Blob
    for kind, fields in (("gaussian", {"mean": 0.5, "std": 2.0}), ("msra", {})):
        for dt in (np.float32, np.float64):
            context.set_random_seed(77)
            b = Blob((3, 5, 7, 11), dtype=dt)
            filler.fill(b, filler_param(kind, **fields))
            context.set_random_seed(77)
            seed = int(context.rng().integers(0, 2 ** 63))
            std = fields.get("std", math.sqrt(2.0 / (5 * 7 * 11)))
            want = gaussian_reference(seed, b.count(), fields.get("mean", 0.0), std).astype(dt)
            np.testing.assert_array_equal(b.data.reshape(-1), want)
            monkeypatch.setattr(_cpu, "rng", None)
            monkeypatch.setattr(filler, "_CHUNK", 64)
            context.set_random_seed(77)
            c = Blob((3, 5, 7, 11), dtype=dt)
            filler.fill(c, filler_param(kind, **fields))
            np.testing.assert_array_equal(c.data, b.data)
            monkeypatch.undo()


@settings(max_examples=10)
@given(seed=SEEDS)
def test_a_non_contiguous_target_gets_the_same_values(seed):
    context.set_random_seed(seed % 2**31)
    data = np.zeros((6, 8), np.float32)[:, ::2]
    filler._fill_normal(context.rng(), 0.0, 1.0, data)
    context.set_random_seed(seed % 2**31)
    want = np.empty(24, np.float32)
    filler._fill_normal(context.rng(), 0.0, 1.0, want)
    np.testing.assert_array_equal(data.reshape(-1), want)


@given(seed=SEEDS, first=st.integers(1, 2**40), n=st.integers(0, 20))
def test_splitmix_outputs_are_the_definition(seed, first, n):
    """caffe.layers.splitmix.outputs against SplitMix64 written out on Python integers."""
    from caffe.layers import splitmix
    M = (1 << 64) - 1
    want = []
    for k in range(first, first + n):
        z = (seed + k * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        want.append(z ^ (z >> 31))
    got = splitmix.outputs(seed, np.arange(first, first + n, dtype=np.uint64))
    assert [int(v) for v in got] == want
