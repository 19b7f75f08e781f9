"""Stand-in for `cupy.random`: NumPy's generators, results on the current fake device.

The draws do not reproduce CuPy's (cuRAND) streams: code that must give the same numbers on CPU and
GPU draws on the host (caffe.blob.context.rng()) and uploads, as the layers do.
"""
from __future__ import annotations

import numpy as np

from caffe.blob._standin._ndarray import ndarray, unwrap, wrap


class RandomState:
    def __init__(self, seed=None):
        self._rs = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)

    def seed(self, seed=None):
        self._rs.seed(None if seed is None else int(seed) & 0xFFFFFFFF)

    def _draw(self, name, *args, dtype=None, **kwargs):
        r = getattr(self._rs, name)(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
        r = np.asarray(r)
        return wrap(r.astype(dtype, copy=False) if dtype is not None else r)

    def rand(self, *size, dtype=float):
        return self._draw("random_sample", size or None, dtype=dtype)

    def randn(self, *size, dtype=float):
        return self._draw("standard_normal", size or None, dtype=dtype)

    def random_sample(self, size=None, dtype=float):
        return self._draw("random_sample", size, dtype=dtype)

    random = random_sample

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return self._draw("uniform", low, high, size, dtype=dtype)

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return self._draw("normal", loc, scale, size, dtype=dtype)

    def standard_normal(self, size=None, dtype=float):
        return self._draw("standard_normal", size, dtype=dtype)

    def randint(self, low, high=None, size=None, dtype=int):
        return self._draw("randint", low, high, size, dtype=dtype)

    def binomial(self, n, p, size=None, dtype=int):
        return self._draw("binomial", n, p, size, dtype=dtype)

    def choice(self, a, size=None, replace=True, p=None):
        return self._draw("choice", a, size, replace, p)

    def permutation(self, x):
        return self._draw("permutation", x)

    def shuffle(self, a):
        if not isinstance(a, ndarray):
            raise TypeError("The array must be cupy.ndarray")
        self._rs.shuffle(a._a)


class Generator:
    """`cupy.random.default_rng(seed)`."""

    def __init__(self, seed=None):
        self._g = np.random.default_rng(seed)

    def _draw(self, name, *args, **kwargs):
        return wrap(np.asarray(getattr(self._g, name)(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})))

    def random(self, size=None, dtype=np.float64, out=None):
        return self._draw("random", size, dtype)

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        return self._draw("standard_normal", size, dtype)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        return self._draw("integers", low, high, size, dtype, endpoint)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._draw("uniform", low, high, size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._draw("normal", loc, scale, size)

    def permutation(self, x):
        return self._draw("permutation", x)


def default_rng(seed=None) -> Generator:
    return Generator(seed)


_global = RandomState()


def get_random_state() -> RandomState:
    return _global


def seed(seed=None) -> None:
    _global.seed(seed)


def _forward(name):
    def f(*args, **kwargs):
        return getattr(_global, name)(*args, **kwargs)
    f.__name__ = name
    return f


for _name in ("rand", "randn", "random_sample", "random", "uniform", "normal", "standard_normal", "randint",
              "binomial", "choice", "permutation", "shuffle"):
    globals()[_name] = _forward(_name)
