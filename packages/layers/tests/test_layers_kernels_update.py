"""kernels.update's steps against the passes they replace (caffe-solver's solvers: Regularize, each solver's
ComputeUpdateValue, Net.Update), in NumPy with the parameter's dtype: the same bits, infinities and signed
zeros too, and NaN in the same places."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

update = pytest.importorskip("caffe.layers.kernels.update")


def sgd_passes(w, g, h, decay, momentum, rate):
    """SGDSolver's array passes, in its order (each operation rounded to the dtype)."""
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


def nesterov_passes(w, g, h, decay, momentum, rate):
    """NesterovSolver's passes: Regularize, its ComputeUpdateValue, Net.Update."""
    w, g, h = w.copy(), g.copy(), h.copy()
    with np.errstate(all="ignore"):
        if decay:
            g = np.add(g, np.multiply(w, decay))
        u = h.copy()
        h = np.multiply(h, momentum)
        h = np.add(h, np.multiply(g, rate))
        u = np.multiply(u, -momentum)
        u = np.add(u, np.multiply(h, type(momentum)(1) + momentum))
        g[...] = u
        w = np.subtract(w, g)
    return w, g, h


def adam_passes(w, g, m, v, decay, beta1, beta2, eps, rate_correction):
    """AdamSolver's passes: Regularize, its ComputeUpdateValue, Net.Update."""
    w, g, m, v = w.copy(), g.copy(), m.copy(), v.copy()
    one = type(beta1)(1)
    with np.errstate(all="ignore"):
        if decay:
            g = np.add(g, np.multiply(w, decay))
        m = np.add(np.multiply(m, beta1), np.multiply(g, one - beta1))
        t = np.multiply(g, g)
        v = np.multiply(v, beta2)
        v = np.add(v, np.multiply(t, one - beta2))
        t = np.sqrt(v)
        t = np.add(t, eps)
        t = np.divide(m, t)
        g[...] = np.multiply(t, rate_correction)
        w = np.subtract(w, g)
    return w, g, m, v


def adagrad_passes(w, g, h, decay, delta, rate):
    w, g, h = w.copy(), g.copy(), h.copy()
    with np.errstate(all="ignore"):
        if decay:
            g = np.add(g, np.multiply(w, decay))
        h = np.add(h, np.square(g))
        u = np.divide(g, np.add(np.sqrt(h), delta))
        g[...] = np.multiply(u, rate)
        w = np.subtract(w, g)
    return w, g, h


def rmsprop_passes(w, g, h, decay, rms_decay, delta, rate):
    w, g, h = w.copy(), g.copy(), h.copy()
    with np.errstate(all="ignore"):
        if decay:
            g = np.add(g, np.multiply(w, decay))
        u = np.square(g)
        h = np.multiply(h, rms_decay)
        u = np.multiply(u, type(rms_decay)(1) - rms_decay)
        h = np.add(h, u)
        u = np.divide(g, np.add(np.sqrt(h), delta))
        g[...] = np.multiply(u, rate)
        w = np.subtract(w, g)
    return w, g, h


def adadelta_passes(w, g, h, h2, decay, momentum, delta, rate):
    w, g, h, h2 = w.copy(), g.copy(), h.copy(), h2.copy()
    one_minus = type(momentum)(1) - momentum
    with np.errstate(all="ignore"):
        if decay:
            g = np.add(g, np.multiply(w, decay))
        h = np.add(np.multiply(h, momentum), np.multiply(np.square(g), one_minus))
        u = np.sqrt(np.divide(np.add(h2, delta), np.add(h, delta)))
        g = np.multiply(g, u)
        h2 = np.add(np.multiply(h2, momentum), np.multiply(np.square(g), one_minus))
        g = np.multiply(g, rate)
        w = np.subtract(w, g)
    return w, g, h, h2


def same_bits(got, want):
    """Bit for bit (signed zeros too) where the passes give a number; NaN where they give NaN (a NaN's sign and
    payload follow which operand the compiler puts first, not the arithmetic)."""
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"array {i}: NaN places")
        ok = ~np.isnan(b)
        np.testing.assert_array_equal(a[ok].view(np.uint8), b[ok].view(np.uint8), err_msg=f"array {i}")


def special(rng, n, dtype):
    x = rng.standard_normal(n).astype(dtype) * dtype(rng.choice([1e-3, 1.0, 1e3]))
    if n:
        k = rng.integers(0, n, size=max(1, n // 50))
        x[k] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40], dtype=dtype), size=len(k))
    return x


# rule: (the kernel, its passes, which of its histories are squares' averages (not negative: a sqrt of a
# negative one is NaN either way), the names of its scalars after decay)
RULES = {
    "sgd": (update.sgd_step, sgd_passes, (False,), ("a", "rate")),
    "nesterov": (update.nesterov_step, nesterov_passes, (False,), ("a", "rate")),
    "adam": (update.adam_step, adam_passes, (False, True), ("a", "b", "delta", "rate")),
    "adagrad": (update.adagrad_step, adagrad_passes, (True,), ("delta", "rate")),
    "rmsprop": (update.rmsprop_step, rmsprop_passes, (True,), ("a", "delta", "rate")),
    "adadelta": (update.adadelta_step, adadelta_passes, (True, True), ("a", "delta", "rate")),
}


@pytest.mark.parametrize("rule", sorted(RULES))
@given(n=st.sampled_from([0, 1, 7, 16383, 16384, 16385, 50001]), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**31 - 1), decay=st.sampled_from([0.0, 0.0005, 0.1, -0.0]),
       a=st.sampled_from([0.0, 0.5, 0.9, 0.99]), b=st.sampled_from([0.5, 0.999]),
       delta=st.sampled_from([1e-8, 1e-6, 0.1]), rate=st.sampled_from([0.01, 1e-5, 0.0, 3.0]))
def test_each_step_is_its_passes_bit_for_bit(rule, n, dtype, seed, decay, a, b, delta, rate):
    kernel, passes, squares, names = RULES[rule]
    rng = np.random.default_rng(seed)
    w, g = (special(rng, n, dtype) for _ in range(2))
    hist = [np.abs(special(rng, n, dtype)) if sq else special(rng, n, dtype) for sq in squares]
    scalars = [dtype(decay)] + [dtype({"a": a, "b": b, "delta": delta, "rate": rate}[k]) for k in names]
    want = passes(w, g, *hist, *scalars)
    kernel(w, g, *hist, *scalars)
    same_bits((w, g, *hist), want)


def test_sgd_step_checks_the_lengths():
    a, b = np.zeros(4, np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="sgd_step: the data has 4 elements, another array 3"):
        update.sgd_step(a, b, a.copy(), 0.0, 0.9, 0.01)
    with pytest.raises(ValueError, match="adam_step: the data has 4 elements, another array 3"):
        update.adam_step(a, a.copy(), a.copy(), b, 0.0, 0.9, 0.999, 1e-8, 0.01)
    with pytest.raises(ValueError, match="nesterov_step: the data has 3 elements, another array 4"):
        update.nesterov_step(b, a, a.copy(), 0.0, 0.9, 0.01)


