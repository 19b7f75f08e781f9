"""Hypothesis strategies shared by the layer properties: shapes and float64 arrays."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def shapes(min_dims: int = 1, max_dims: int = 4, min_side: int = 1, max_side: int = 4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arrays(shape, low: float = -2.0, high: float = 2.0, avoid: tuple[float, float] | None = None):
    """float64 arrays of `shape` in [low, high]; `avoid=(kink, radius)` keeps values away from a kink."""
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)
    strat = hnp.arrays(np.float64, shape, elements=elements)
    if avoid is not None:
        kink, radius = avoid
        strat = strat.map(lambda a: np.where(np.abs(a - kink) < radius,
                                             kink + np.copysign(radius * 2, a - kink + 1e-300), a))
    return strat


def seeds():
    return st.integers(0, 2**31 - 1)


def random_array(seed: int, shape, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """A reproducible float64 array: draw a seed with hypothesis, make the values with NumPy (cheaper)."""
    return np.random.default_rng(seed).uniform(low, high, size=shape)
