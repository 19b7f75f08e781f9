"""The stand-in's `cupy.*` functions: NumPy's, computing on device arrays, refusing host arrays.

Ufuncs take device arrays and scalars only (a NumPy array or a list operand is a TypeError, as in
CuPy); routines unwrap device arrays anywhere in their arguments and refuse host arrays; the
explicit transfers (`asarray`/`array` of host data, `asnumpy`) are counted.
"""
from __future__ import annotations

import builtins

import numpy as np

from caffe.blob._standin import _state
from caffe.blob._standin._memory import transfers
from caffe.blob._standin._ndarray import (check_device, index_arg, ndarray, unsupported, unwrap,
                                          unwrap_kernel_arg, wrap, wrap_result)


class ufunc:  # noqa: N801 (CuPy's name)
    """A CuPy ufunc: `f(*arrays_or_scalars, out=None, dtype=None, ...)`; `reduce`/`accumulate`/`outer`/`at`."""

    def __init__(self, np_ufunc: np.ufunc):
        self._f = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs
        self.types = np_ufunc.types
        self.__doc__ = f"cupy.{self.__name__} (stand-in: NumPy's ufunc on the fake device)"

    def __repr__(self):
        return f"<ufunc '{self.__name__}' (CuPy stand-in)>"

    @staticmethod
    def _out(kwargs):
        out = kwargs.get("out")
        if out is None:
            return None
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if not isinstance(o, ndarray):
                raise TypeError(f"Output arguments must be cupy.ndarray, got {type(o)}")
            check_device(o)
        kwargs["out"] = tuple(o._a for o in outs) if isinstance(out, tuple) else out._a
        return out

    def __call__(self, *args, **kwargs):
        arrays = [unwrap_kernel_arg(a) for a in args]
        out = self._out(kwargs)
        if "where" in kwargs:
            kwargs["where"] = unwrap_kernel_arg(kwargs["where"])
        r = self._f(*arrays, **kwargs)
        return out if out is not None else wrap_result(r)

    def _method(self, name, args, kwargs):
        arrays = [unwrap_kernel_arg(a) for a in args]
        out = self._out(kwargs)
        r = getattr(self._f, name)(*arrays, **kwargs)
        return out if out is not None else wrap_result(r)

    def reduce(self, array, *args, **kwargs):
        return self._method("reduce", (array,) + args, kwargs)

    def accumulate(self, array, *args, **kwargs):
        return self._method("accumulate", (array,) + args, kwargs)

    def outer(self, a, b, **kwargs):
        return self._method("outer", (a, b), kwargs)

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise unsupported(a)
        check_device(a)
        idx = unwrap(indices) if not isinstance(indices, np.ndarray) else _upload(indices)
        args = (a._a, idx) if b is None else (a._a, idx, unwrap_kernel_arg(b))
        self._f.at(*args)


def _upload(host) -> np.ndarray:
    arr = np.asarray(host)
    transfers.record("h2d", arr.nbytes)
    return arr


# every NumPy ufunc has its CuPy twin of the same name
for _name in dir(np):
    _obj = getattr(np, _name)
    if isinstance(_obj, np.ufunc):
        globals()[_name] = ufunc(_obj)
# names CuPy keeps that NumPy 2 spells differently
for _alias, _name in (("divide", "true_divide"), ("abs", "absolute"), ("conj", "conjugate"), ("pow", "power")):
    if _name in globals() and _alias not in globals():
        globals()[_alias] = globals()[_name]


def _routine(np_func, name: str | None = None):
    def f(*args, **kwargs):
        out = kwargs.get("out")
        if out is not None:
            if not isinstance(out, ndarray):
                raise TypeError(f"Output argument must be cupy.ndarray, got {type(out)}")
            check_device(out)
        r = np_func(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
        return out if out is not None else wrap_result(r)

    f.__name__ = name or np_func.__name__
    f.__doc__ = f"cupy.{f.__name__} (stand-in: numpy.{np_func.__name__} on the fake device)"
    return f


_ROUTINES = (
    # manipulation
    "reshape", "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "expand_dims", "squeeze", "concatenate",
    "stack", "vstack", "hstack", "dstack", "column_stack", "split", "array_split", "hsplit", "vsplit",
    "broadcast_to", "broadcast_arrays", "tile", "repeat", "flip", "fliplr", "flipud", "roll", "rot90", "pad",
    "atleast_1d", "atleast_2d", "atleast_3d", "append", "copy", "asfortranarray",
    # math, reductions, statistics
    "sum", "prod", "mean", "var", "std", "max", "min", "amax", "amin", "argmax", "argmin", "nanmax", "nanmin",
    "nansum", "nanmean", "cumsum", "cumprod", "diff", "ptp", "median", "percentile", "quantile", "average",
    "clip", "around", "round", "dot", "vdot", "tensordot", "einsum", "inner", "outer", "kron", "trace",
    "diagonal", "diag", "diagflat", "tril", "triu", "cross", "convolve", "correlate", "nan_to_num", "real", "imag",
    "angle", "cov", "corrcoef", "histogram", "interp",
    # indexing and searching
    "take", "take_along_axis", "put_along_axis", "choose", "compress", "nonzero", "argwhere", "flatnonzero",
    "searchsorted", "sort", "argsort", "lexsort", "partition", "argpartition", "unique", "bincount",
    "count_nonzero", "extract", "select", "digitize", "isin", "place", "putmask",
    # logic
    "all", "any", "isclose",
    # creation from shapes or prototypes (no host data)
    "empty_like", "zeros_like", "ones_like", "full_like", "meshgrid", "tri",
)
for _name in _ROUTINES:
    if hasattr(np, _name):
        globals()[_name] = _routine(getattr(np, _name), _name)


def take(a, indices, axis=None, out=None, mode="wrap"):
    if not isinstance(a, ndarray):
        raise unsupported(a)
    return a.take(indices, axis=axis, out=out, mode=mode)


def take_along_axis(a, indices, axis):
    if not isinstance(a, ndarray):
        raise unsupported(a)
    check_device(a)
    return wrap(np.take_along_axis(a._a, index_arg(indices), axis))


def _synced(name):
    """Routines whose output size depends on the data: CuPy reads a count back (one small d2h)."""
    f = globals()[name]

    def g(*args, **kwargs):
        transfers.record("d2h", 8)
        return f(*args, **kwargs)
    g.__name__, g.__doc__ = name, f.__doc__
    return g


for _name in ("nonzero", "argwhere", "flatnonzero", "unique", "compress", "extract"):
    globals()[_name] = _synced(_name)


def where(condition, x=None, y=None):
    if x is None and y is None:
        return nonzero(condition)  # noqa: F821 (defined above)
    if x is None or y is None:
        raise ValueError("Missing x or y argument")
    return wrap(np.where(unwrap_kernel_arg(condition), unwrap_kernel_arg(x), unwrap_kernel_arg(y)))


def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(dst, ndarray):
        raise TypeError(f"dst must be cupy.ndarray, got {type(dst)}")
    check_device(dst)
    kwargs = {} if where is None else {"where": unwrap_kernel_arg(where)}
    np.copyto(dst._a, unwrap_kernel_arg(src), casting=casting, **kwargs)


def put(a, indices, values, mode="wrap"):
    if not isinstance(a, ndarray):
        raise unsupported(a)
    check_device(a)
    vals = _upload(values) if isinstance(values, (np.ndarray, list)) else unwrap(values)
    np.put(a._a, index_arg(indices), vals, mode=mode)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return wrap(np.asarray(np.allclose(unwrap_kernel_arg(a), unwrap_kernel_arg(b), rtol, atol, equal_nan)))


def array_equal(a1, a2, equal_nan=False):
    return wrap(np.asarray(np.array_equal(unwrap_kernel_arg(a1), unwrap_kernel_arg(a2), equal_nan=equal_nan)))


# ----------------------------------------------------------------------------------- creation

def _new(fn, *args, **kwargs):
    from caffe.blob._standin import runtime
    runtime.check_device(_state.current_device())
    return wrap(fn(*args, **kwargs))


def empty(shape, dtype=float, order="C"):
    return _new(np.empty, shape, dtype, order=order)


def zeros(shape, dtype=float, order="C"):
    return _new(np.zeros, shape, dtype, order=order)


def ones(shape, dtype=float, order="C"):
    return _new(np.ones, shape, dtype, order=order)


def full(shape, fill_value, dtype=None, order="C"):
    return _new(np.full, shape, unwrap_kernel_arg(fill_value), dtype, order=order)


def arange(start, stop=None, step=None, dtype=None):
    return _new(np.arange, start, stop, step, dtype=dtype)


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    r = np.linspace(start, stop, num, endpoint, retstep, dtype, axis)
    return (wrap(r[0]), r[1]) if retstep else wrap(r)


def eye(N, M=None, k=0, dtype=float, order="C"):
    return _new(np.eye, N, M, k, dtype, order)


def identity(n, dtype=float):
    return _new(np.identity, n, dtype)


def indices(dimensions, dtype=int):
    return _new(np.indices, dimensions, dtype)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    """A device array from host data (a counted host->device copy) or from a device array."""
    cur = _state.current_device()
    if isinstance(obj, ndarray):
        if obj._device != cur:
            transfers.record("p2p", obj.nbytes)
            copy = True
        a = np.array(obj._a, dtype=dtype, copy=True if copy else None, order=order, ndmin=ndmin)
        return obj if a is obj._a else wrap(a, cur if copy or a.base is None else obj._device)
    if isinstance(obj, (list, tuple)) and builtins.any(isinstance(v, ndarray) for v in obj):
        return stack([asarray(v, dtype) for v in obj])  # noqa: F821 (defined above)
    from caffe.blob._standin import runtime
    runtime.check_device(cur)
    a = np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin)
    if a.dtype == object:
        raise ValueError(f"Unsupported dtype object (from {type(obj).__name__})")
    transfers.record("h2d", a.nbytes)
    return wrap(a, cur)


def asarray(a, dtype=None, order=None, blocking=False):
    return array(a, dtype=dtype, copy=False, order=order or "K", blocking=blocking)


asanyarray = asarray


def ascontiguousarray(a, dtype=None):
    if isinstance(a, ndarray):
        check_device(a)
        return wrap(np.ascontiguousarray(a._a, dtype=dtype))
    return array(a, dtype=dtype, order="C")


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """Device -> host (counted); a host object is returned as a NumPy array without a transfer."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    if out is not None:
        out[...] = a
        return out
    return np.asarray(a, order=order)


def get_array_module(*args):
    import sys
    if builtins.any(isinstance(a, ndarray) for a in args):
        return sys.modules["cupy"] if "cupy" in sys.modules else None
    return np


def fuse(*args, **kwargs):
    """cupy.fuse: the stand-in runs the function eagerly, op by op (no fused kernel)."""
    def deco(fn):
        return fn
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return deco


def size(a, axis=None):
    return np.size(a._a if isinstance(a, ndarray) else a, axis)


def shape(a):
    return a.shape


def ndim(a):
    return a.ndim if isinstance(a, ndarray) else np.ndim(a)


def isscalar(x):
    return np.isscalar(x)


def result_type(*args):
    return np.result_type(*[a.dtype if isinstance(a, ndarray) else a for a in args])

