"""kernels.update.sgd_step against the passes it replaces (caffe-solver's SGDSolver: Regularize,
ComputeUpdateValue, Net.Update), in NumPy with the parameter's dtype: the same bits, NaN and infinities too."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

update = pytest.importorskip("caffe.layers.kernels.update")


def passes(w, g, h, decay, momentum, rate):
    """The solver's array passes, in its order (each operation rounded to the dtype)."""
    w, g, h = w.copy(), g.copy(), h.copy()
    with np.errstate(all="ignore"):
        return _passes(w, g, h, decay, momentum, rate)


def _passes(w, g, h, decay, momentum, rate):
    if decay:
        t = np.multiply(w, decay)
        g = np.add(g, t)
    h = np.multiply(h, momentum)
    t = np.multiply(g, rate)
    h = np.add(h, t)
    g[...] = h
    w = np.subtract(w, g)
    return w, g, h


def special(rng, n, dtype):
    x = rng.standard_normal(n).astype(dtype) * dtype(rng.choice([1e-3, 1.0, 1e3]))
    if n:
        k = rng.integers(0, n, size=max(1, n // 50))
        x[k] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40], dtype=dtype), size=len(k))
    return x


@given(n=st.sampled_from([0, 1, 7, 16383, 16384, 16385, 50001]), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**31 - 1), decay=st.sampled_from([0.0, 0.0005, 0.1, -0.0]),
       momentum=st.sampled_from([0.0, 0.9, 0.99]), rate=st.sampled_from([0.01, 1e-5, 0.0, 3.0]))
def test_sgd_step_is_the_passes_bit_for_bit(n, dtype, seed, decay, momentum, rate):
    rng = np.random.default_rng(seed)
    w, g, h = (special(rng, n, dtype) for _ in range(3))
    decay, momentum, rate = dtype(decay), dtype(momentum), dtype(rate)
    want = passes(w, g, h, decay, momentum, rate)
    update.sgd_step(w, g, h, decay, momentum, rate)
    for got, ref, name in zip((w, g, h), want, ("data", "diff", "history")):
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8), err_msg=name)


def test_sgd_step_checks_the_lengths():
    a, b = np.zeros(4, np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="data 4, diff 3 and history 4 elements differ"):
        update.sgd_step(a, b, a.copy(), 0.0, 0.9, 0.01)
