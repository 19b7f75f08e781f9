"""The stand-in's device array: NumPy memory that behaves like `cupy.ndarray` at the host boundary.

It refuses every implicit conversion to or from host arrays as CuPy does (`np.asarray(dev)`, NumPy
arrays as operands, `dev[...] = host_array`), remembers its fake device, refuses operands on another
device than the current one, returns 0-d device arrays from reductions and scalar indexing, and counts
the explicit transfers (`get`, `set`, `float()`, `item`, `tolist`, `repr`, host index arrays).
"""
from __future__ import annotations

import numpy as np

from caffe.blob._standin import _state
from caffe.blob._standin._memory import registry, transfers

_PY_SCALARS = (bool, int, float, complex)


def _is_scalar(x) -> bool:
    return isinstance(x, _PY_SCALARS) or isinstance(x, np.generic)


def unsupported(x) -> TypeError:
    return TypeError(f"Unsupported type {type(x)}")


def check_device(arr: "ndarray") -> None:
    cur = _state.current_device()
    if arr._device != cur:
        raise ValueError(f"Array device must be same as the current device: array device = {arr._device} while "
                         f"current = {cur}")


def wrap(a, device: int | None = None):
    """A stand-in array around NumPy result `a` (NumPy scalars become 0-d device arrays)."""
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    out = ndarray.__new__(ndarray)
    out._a = a
    out._device = registry.device_of(a, _state.current_device() if device is None else device)
    return out


def wrap_result(r):
    if isinstance(r, (np.ndarray, np.generic)):
        return wrap(r)
    if isinstance(r, tuple):
        return tuple(wrap_result(x) for x in r)
    if isinstance(r, list):
        return [wrap_result(x) for x in r]
    return r


def unwrap(x, where: str = ""):
    """The NumPy array behind a stand-in argument; TypeError for a host array (as CuPy raises)."""
    if isinstance(x, ndarray):
        check_device(x)
        return x._a
    if isinstance(x, np.ndarray):
        raise unsupported(x)
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v, where) for v in x)
    return x


def unwrap_kernel_arg(x):
    """A kernel operand: a stand-in array or a scalar; host arrays and lists are refused as CuPy does."""
    if isinstance(x, ndarray):
        check_device(x)
        return x._a
    if x is None or _is_scalar(x):
        return x
    raise unsupported(x)


def _index(key, what: str):
    """Index `key` with device arrays unwrapped; host index arrays/lists are uploaded (counted)."""
    if isinstance(key, tuple):
        return tuple(_index(k, what)[0] for k in key), any(_is_advanced(k) for k in key)
    if isinstance(key, ndarray):
        check_device(key)
        if key.dtype == np.bool_:
            transfers.record("d2h", 8)  # a mask's result size is read back (CuPy syncs here too)
        return key._a, True
    if isinstance(key, (np.ndarray, list)):
        arr = np.asarray(key)
        if arr.dtype == object:
            raise IndexError(f"{what}: unsupported index {key!r}")
        transfers.record("h2d", arr.nbytes)
        return arr, True
    return key, False


def _is_advanced(k) -> bool:
    return isinstance(k, (ndarray, np.ndarray, list)) or (isinstance(k, (bool, np.bool_)))


class _Flags:
    def __init__(self, a: np.ndarray):
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = a.base is None

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]

    def __repr__(self):
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n  OWNDATA : {self.owndata}"


class ndarray:  # noqa: N801 (CuPy's name)
    """`cupy.ndarray` of the stand-in: `ndarray(shape, dtype=float, memptr=None, strides=None, order='C')`."""

    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        if memptr is None:
            if strides is not None:
                raise ValueError("memptr is required if strides is given.")
            self._a = np.empty(shape, dtype, order=order)
            self._device = registry.device_of(self._a, _state.current_device())
            return
        n = int(np.prod(shape)) * dtype.itemsize if strides is None else \
            (sum((d - 1) * s for d, s in zip(shape, strides)) + dtype.itemsize if all(shape) else 0)
        buf, device = registry.resolve(memptr.ptr, n, "cupy.ndarray(memptr=...)")
        self._a = np.ndarray(shape, dtype, buffer=buf, strides=strides, order=order)
        self._device = device
        self._keep = memptr.mem

    # -- attributes ------------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)

    @shape.setter
    def shape(self, value):
        a = self._a.view()
        a.shape = value
        self._a = a

    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    T = property(lambda self: wrap(self._a.T))
    mT = property(lambda self: wrap(self._a.mT))
    real = property(lambda self: wrap(self._a.real))
    imag = property(lambda self: wrap(self._a.imag))

    @property
    def base(self):
        return None if self._a.base is None else wrap(registry.owner_of(self._a))

    @property
    def device(self):
        from caffe.blob._standin.cuda import Device
        return Device(self._device)

    @property
    def data(self):
        from caffe.blob._standin.cuda import MemoryPointer, _ArrayMemory
        owner = registry.owner_of(self._a)
        mem = _ArrayMemory(owner, self._device)
        return MemoryPointer(mem, int(self._a.__array_interface__["data"][0]) - mem.ptr)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr, "version": 3,
                "strides": None if self._a.flags.c_contiguous else self.strides,
                "data": (self.data.ptr if self.size else 0, False), "stream": 1}

    # -- the host boundary ------------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly.")

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
            out[...] = self._a
        else:
            out = np.array(self._a, order=order, copy=True)
        transfers.record("d2h", self.nbytes)
        return out

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        self._a[...] = arr
        transfers.record("h2d", self.nbytes)

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def tobytes(self, order="C"):
        return self.get().tobytes(order)

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __complex__(self):
        return complex(self.get())

    def __bool__(self):
        if self.size == 0:
            raise ValueError("The truth value of an empty array is ambiguous.")
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self.get())

    def __repr__(self):
        return repr(self.get())

    def __str__(self):
        return str(self.get())

    def __format__(self, spec):
        return format(self.get(), spec)

    def __reduce__(self):
        return _rebuild, (self.get(), self._device)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        from caffe.blob._standin.cuda import Device
        with Device(self._device):
            return self.copy()

    # -- NumPy protocols: NumPy functions on device arrays run on the device, host operands are refused
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from caffe.blob._standin import _functions
        if method != "__call__":
            return NotImplemented
        cp_ufunc = getattr(_functions, ufunc.__name__, None)
        if not isinstance(cp_ufunc, _functions.ufunc):
            return NotImplemented
        if "out" in kwargs and isinstance(kwargs["out"], tuple):
            if len(kwargs["out"]) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            kwargs["out"] = kwargs["out"][0]
        return cp_ufunc(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from caffe.blob._standin import module_for
        target = module_for(func.__module__)
        cp_func = getattr(target, func.__name__, None) if target is not None else None
        if cp_func is None or cp_func is func:
            return NotImplemented
        return cp_func(*args, **kwargs)

    # -- container ---------------------------------------------------------------------------------
    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __getitem__(self, key):
        idx, _ = _index(key, "cupy.ndarray.__getitem__")
        return wrap(self._a[idx], self._device)

    def __setitem__(self, key, value):
        idx, advanced = _index(key, "cupy.ndarray.__setitem__")
        if isinstance(value, ndarray):
            check_device(value)
            self._a[idx] = value._a
            return
        if isinstance(value, (np.ndarray, list, tuple)):
            arr = np.asarray(value)
            if not advanced:
                # CuPy fills with a scalar here and refuses a host array: use cupy.asarray(x) or .set(x)
                if isinstance(value, np.ndarray) and arr.ndim == 0:
                    value = arr.item()
                elif isinstance(value, np.ndarray):
                    raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
                else:
                    raise unsupported(value)
            else:
                transfers.record("h2d", arr.nbytes)
                value = arr
        elif not _is_scalar(value):
            raise unsupported(value)
        self._a[idx] = value

    def fill(self, value):
        if isinstance(value, ndarray):
            if value.ndim != 0:
                raise ValueError("non-scalar cupy.ndarray cannot be used for fill")
            check_device(value)
            value = value._a
        elif isinstance(value, np.ndarray):
            if value.ndim != 0:
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        elif not _is_scalar(value):
            raise unsupported(value)
        self._a.fill(value)

    # -- copies and views --------------------------------------------------------------------------
    def copy(self, order="C"):
        """A copy on the current device (from any device, as CuPy allows)."""
        cur = _state.current_device()
        out = wrap(np.array(self._a, order=order, copy=True), cur)
        if self._device != cur:
            transfers.record("p2p", self.nbytes)
        return out

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        check_device(self)
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return wrap(self._a.astype(dtype, order=order, copy=True))

    def view(self, dtype=None):
        a = self._a.view() if dtype is None else self._a.view(dtype)
        return wrap(a, self._device)

    def reduced_view(self, dtype=None):
        return self.view() if self._a.ndim <= 1 or not self._a.flags.c_contiguous else wrap(self._a.reshape(-1))

    def scatter_add(self, slices, value):
        from caffe.blob._standin.cupyx import scatter_add
        scatter_add(self, slices, value)

    def scatter_max(self, slices, value):
        from caffe.blob._standin.cupyx import scatter_max
        scatter_max(self, slices, value)

    def scatter_min(self, slices, value):
        from caffe.blob._standin.cupyx import scatter_min
        scatter_min(self, slices, value)

    def dot(self, b, out=None):
        from caffe.blob._standin._functions import dot
        return dot(self, b, out=out)

    def sort(self, axis=-1, kind=None, order=None):
        check_device(self)
        self._a.sort(axis=axis, kind=kind)

    def put(self, indices, values, mode="wrap"):
        from caffe.blob._standin._functions import put
        put(self, indices, values, mode)


def _rebuild(host: np.ndarray, device: int):
    from caffe.blob._standin import runtime
    if not 0 <= device < _state.device_count():
        device = 0
    runtime.check_device(device)
    transfers.record("h2d", host.nbytes)
    return wrap(np.array(host, copy=True), device)


_VIEWS = ("reshape", "transpose", "swapaxes", "squeeze")  # no kernel: CuPy allows them on any device's array


def _method(name: str):
    np_method = getattr(np.ndarray, name)

    def method(self, *args, **kwargs):
        if name not in _VIEWS:
            check_device(self)
        out = kwargs.get("out")
        if isinstance(out, ndarray):
            kwargs["out"] = unwrap(out)
        r = np_method(self._a, *unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
        if out is not None and isinstance(out, ndarray):
            return out
        return wrap_result(r)

    method.__name__ = name
    method.__doc__ = f"cupy.ndarray.{name} (stand-in: NumPy's, on the fake device)"
    return method


def _take(self, indices, axis=None, out=None, mode="wrap"):
    """take: host indices are uploaded (counted), as CuPy does."""
    check_device(self)
    idx = index_arg(indices)
    r = self._a.take(idx, axis=axis, mode="wrap" if mode == "wrap" else mode)
    if out is not None:
        out[...] = wrap(r)
        return out
    return wrap(r)


def index_arg(indices):
    """Indices for take/take_along_axis/put: device arrays as they are, host ones uploaded (counted)."""
    if isinstance(indices, ndarray):
        check_device(indices)
        return indices._a
    if isinstance(indices, (np.ndarray, list, tuple)):
        arr = np.asarray(indices)
        transfers.record("h2d", arr.nbytes)
        return arr
    return indices


ndarray.take = _take

# methods that compute on the device and return device arrays (views stay on the array's device)
for _name in ("reshape", "ravel", "flatten", "transpose", "swapaxes", "squeeze", "repeat", "sum", "mean",
              "var", "std", "prod", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "any", "all", "clip",
              "round", "nonzero", "argsort", "diagonal", "trace", "conj", "conjugate", "ptp", "partition",
              "argpartition", "choose", "compress"):
    if hasattr(np.ndarray, _name):
        setattr(ndarray, _name, _method(_name))


def _binary(name: str, reflected: bool = False, inplace: bool = False):
    def op(self, other):
        from caffe.blob._standin import _functions
        if not (isinstance(other, (ndarray, np.ndarray, list)) or _is_scalar(other)):
            return NotImplemented
        f = getattr(_functions, name)
        if inplace:
            return f(self, other, out=self)
        return f(other, self) if reflected else f(self, other)
    return op


for _op, _uf in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                 ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "power"), ("matmul", "matmul"),
                 ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor"), ("lshift", "left_shift"),
                 ("rshift", "right_shift")):
    setattr(ndarray, f"__{_op}__", _binary(_uf))
    setattr(ndarray, f"__r{_op}__", _binary(_uf, reflected=True))
    setattr(ndarray, f"__i{_op}__", _binary(_uf, inplace=True))

for _op, _uf in (("lt", "less"), ("le", "less_equal"), ("eq", "equal"), ("ne", "not_equal"), ("gt", "greater"),
                 ("ge", "greater_equal")):
    setattr(ndarray, f"__{_op}__", _binary(_uf))


def _unary(name: str):
    def op(self):
        from caffe.blob._standin import _functions
        return getattr(_functions, name)(self)
    return op


ndarray.__neg__ = _unary("negative")
ndarray.__abs__ = _unary("absolute")
ndarray.__invert__ = _unary("invert")
ndarray.__pos__ = lambda self: self
