"""Stand-in for `cupyx`: scatter_add/max/min, pinned host arrays, errstate."""
from __future__ import annotations

import contextlib

import numpy as np

from caffe.blob._standin._functions import _upload
from caffe.blob._standin._ndarray import check_device, ndarray, unwrap, unwrap_kernel_arg, unsupported


def _scatter(ufunc, a, slices, value):
    if not isinstance(a, ndarray):
        raise unsupported(a)
    check_device(a)
    if isinstance(slices, (np.ndarray, list)):
        idx = _upload(slices)
    elif isinstance(slices, tuple):
        idx = tuple(_upload(s) if isinstance(s, (np.ndarray, list)) else unwrap(s) for s in slices)
    else:
        idx = unwrap(slices)
    ufunc.at(a._a, idx, unwrap_kernel_arg(value))


def scatter_add(a, slices, value) -> None:
    _scatter(np.add, a, slices, value)


def scatter_max(a, slices, value) -> None:
    _scatter(np.maximum, a, slices, value)


def scatter_min(a, slices, value) -> None:
    _scatter(np.minimum, a, slices, value)


def empty_pinned(shape, dtype=float, order="C") -> np.ndarray:
    return np.empty(shape, dtype, order=order)


def zeros_pinned(shape, dtype=float, order="C") -> np.ndarray:
    return np.zeros(shape, dtype, order=order)


def empty_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> np.ndarray:
    return np.empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def zeros_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> np.ndarray:
    return np.zeros(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


@contextlib.contextmanager
def errstate(**kwargs):
    yield


def seterr(**kwargs) -> dict:
    return {}


def geterr() -> dict:
    return {}
