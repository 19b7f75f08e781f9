# cython: language_level=3, boundscheck=False, wraparound=False
"""Blob: an N-d array with a data and a diff, each backed by a SyncedMemory.

Owns its shape, count and capacity. Reshape grows capacity (new memory) and
never reallocates when shrinking, as in Caffe. Python users see pycaffe's
surface: `.data` / `.diff` are writable NumPy views, `.shape`, `.count`,
`.reshape(*dims)`.

Compiled by Cython (a cdef class): the shape is kept as a C array beside the
tuple, so offsets and counts are C loops, and each shaped host view is one
NumPy C-API call over the SyncedMemory's flat view (a layer asks for several
views per call: at batch 1 this is a visible share of the time).

A blob's data may be "pending": a net that folded this blob's producer away
(inference folding, caffe.net.fold) registers a function that computes the
value on first read. Every data accessor runs it first; diffs are never pending.
"""
import numpy as np
cimport numpy as cnp

from caffe.blob.syncedmem import SyncedMemory, HEAD_AT_CPU, HEAD_AT_GPU, SYNCED, UNINITIALIZED

cnp.import_array()

MAX_BLOB_AXES = 32
cdef enum:
    _MAX_AXES = 32
cdef long long _INT_MAX = 2**31 - 1
cdef object _np = np
cdef object _integer = np.integer


def _dims(args) -> list:
    """Accept reshape(2, 3), reshape([2, 3]), reshape((2, 3)) or reshape(BlobShape)."""
    if len(args) == 1 and not isinstance(args[0], (int, _integer)):
        a = args[0]
        if hasattr(a, "dim"):  # BlobShape
            return [int(d) for d in a.dim]
        return [int(d) for d in a]
    return [int(d) for d in args]


def _count_range(shape, start, end):
    n_axes = len(shape)
    if end is None:
        end = n_axes
        if start < 0:
            if start < -n_axes:
                raise IndexError(f"axis {start} out of range for the {n_axes}-d blob with shape {shape}")
            start += n_axes
    if not (0 <= start <= end <= n_axes):
        raise IndexError(f"Blob.count({start}, {end}) out of range for shape {shape}")
    n = 1
    for d in shape[start:end]:
        n *= d
    return n


def _double_arg(args, kwargs):
    if len(args) > 1 or (args and kwargs) or set(kwargs) - {"double"}:
        raise TypeError(f"to_proto(write_diff=False, proto=None, double=None): unexpected arguments "
                        f"{args} {sorted(kwargs)}")
    return args[0] if args else kwargs.get("double")


class _Count(int):
    """An int that can also be called like Caffe's Blob::count(start, end)."""
    def __new__(cls, value, shape):
        obj = super().__new__(cls, value)
        obj._shape = shape  # the shape, not the blob: no reference cycle keeping blob memory alive
        return obj

    def __call__(self, start=None, end=None):
        if start is None:
            return int(self)
        return _count_range(self._shape, start, end)


cdef class Blob:
    cdef tuple _shape
    cdef Py_ssize_t _count
    cdef Py_ssize_t _capacity
    cdef int _ndim
    cdef cnp.npy_intp _cdims[_MAX_AXES]
    cdef object _count_obj
    cdef object _data
    cdef object _diff
    cdef object _lazy
    cdef public object dtype
    cdef object __weakref__

    def __init__(self, *shape, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._shape = ()
        self._count = 0
        self._ndim = 0
        self._count_obj = _Count(0, ())
        self._capacity = 0
        self._data = None
        self._diff = None
        self._lazy = None
        if shape:
            self.reshape(*shape)

    # -- shape ---------------------------------------------------------------
    def reshape(self, *shape) -> None:
        if self._data is not None and shape == self._shape:  # the common case: every Forward reshapes
            return
        self._reshape(_dims(shape))

    cdef _reshape(self, list dims):
        cdef Py_ssize_t n = len(dims), i
        cdef long long d, count = 1
        if n > _MAX_AXES:
            raise ValueError(f"Blob.reshape: {n} axes exceed the maximum of {MAX_BLOB_AXES}")
        for i in range(n):
            d = dims[i]
            if d < 0:
                raise ValueError(f"Blob.reshape: negative dimension in shape {dims}")
            if d and count > _INT_MAX // d:
                raise ValueError(f"Blob.reshape: shape {dims} has more than INT_MAX elements")
            count *= d
        shape = tuple(dims)
        if shape != self._shape or self._data is None:
            self._lazy = None  # a pending value was for the old shape
            self._shape = shape
            self._count_obj = _Count(count, shape)
            self._ndim = <int>n
            for i in range(n):
                self._cdims[i] = dims[i]
        self._count = count
        if count > self._capacity or self._data is None:
            self._capacity = count
            nbytes = count * self.dtype.itemsize
            self._data = SyncedMemory(nbytes)
            self._diff = SyncedMemory(nbytes)

    def Reshape(self, *shape) -> None:
        self.reshape(*shape)

    def reshape_like(self, Blob other) -> None:
        if self._data is not None and other._shape == self._shape:
            return
        self._reshape(list(other._shape))

    def ReshapeLike(self, Blob other) -> None:
        self.reshape_like(other)

    @property
    def shape(self):
        return self._shape

    @property
    def num_axes(self):
        return self._ndim

    @property
    def capacity(self):
        return self._capacity

    def shape_string(self) -> str:
        return " ".join(str(d) for d in self._shape) + f" ({self._count})"

    @property
    def count(self):
        """pycaffe's `blob.count` (an int) and Caffe's `count()`, `count(start)`, `count(start, end)`."""
        return self._count_obj

    def count_range(self, start, end=None) -> int:
        """Product of the dims in [start, end) (end defaults to num_axes; a negative start is canonicalized)."""
        return _count_range(self._shape, start, end)

    def canonical_axis_index(self, axis) -> int:
        cdef int n = self._ndim
        if not -n <= axis < n:
            raise IndexError(f"axis {axis} out of range for the {n}-d blob with shape {self._shape}")
        return axis + n if axis < 0 else axis

    def CanonicalAxisIndex(self, axis) -> int:
        return self.canonical_axis_index(axis)

    def dim(self, axis) -> int:
        return self._shape[self.canonical_axis_index(axis)]

    def legacy_shape(self, index) -> int:
        if self._ndim > 4:
            raise ValueError(f"legacy accessors need a blob of <= 4 axes; shape is {self._shape}")
        if not -4 <= index < 4:
            raise IndexError(f"legacy shape index {index} out of range")
        if index >= self._ndim or index < -self._ndim:
            return 1
        return self.dim(index)

    @property
    def num(self):
        return self.legacy_shape(0)

    @property
    def channels(self):
        return self.legacy_shape(1)

    @property
    def height(self):
        return self.legacy_shape(2)

    @property
    def width(self):
        return self.legacy_shape(3)

    def offset(self, *indices) -> int:
        idx = _dims(indices) if indices else []
        cdef Py_ssize_t k = len(idx), axis
        cdef long long off = 0, i
        if k > self._ndim:
            raise IndexError(f"offset: {k} indices for a {self._ndim}-d blob")
        for axis in range(self._ndim):
            off *= self._cdims[axis]
            if axis < k:
                i = idx[axis]
                if not 0 <= i < self._cdims[axis]:
                    raise IndexError(f"offset: index {i} out of range on axis {axis} of {self._shape}")
                off += i
        return off

    def shape_equals(self, proto) -> bool:
        if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or proto.HasField("width"):
            if self._ndim > 4:
                return False
            return (self.legacy_shape(-4), self.legacy_shape(-3), self.legacy_shape(-2),
                    self.legacy_shape(-1)) == (proto.num, proto.channels, proto.height, proto.width)
        return tuple(proto.shape.dim) == self._shape

    # -- pending data (inference folding) ---------------------------------------
    cdef inline int _touch(self) except -1:
        cdef object fn
        if self._lazy is not None:
            fn = self._lazy
            self._lazy = None
            fn(self)
        return 0

    def _set_lazy(self, fn) -> None:
        """Register fn(blob), run (once) before the data is next read or written; None drops it."""
        self._lazy = fn

    @property
    def _lazy_pending(self):
        return self._lazy is not None

    # -- memory access -------------------------------------------------------
    cdef object _shaped(self, cnp.ndarray flat, bint writeable):
        """The first count elements of the flat host view, shaped, as one C call (base: flat's owner)."""
        if not cnp.PyArray_ISNOTSWAPPED(flat) or cnp.PyArray_ISFLEXIBLE(flat) or cnp.PyArray_ISOBJECT(flat):
            return flat[: self._count].reshape(self._shape)  # dtypes a type number does not describe
        arr = cnp.PyArray_New(cnp.ndarray, self._ndim, self._cdims, cnp.PyArray_TYPE(flat), NULL,
                              cnp.PyArray_DATA(flat), 0,
                              cnp.NPY_ARRAY_CARRAY if writeable else cnp.NPY_ARRAY_CARRAY_RO, None)
        cnp.set_array_base(arr, flat)
        return arr

    cdef object _host(self, object mem, bint mutable):
        if mutable:
            return self._shaped(mem.mutable_cpu_data(self.dtype), True)
        return self._shaped(mem.cpu_data(self.dtype), False)

    cdef object _device(self, object mem, bint mutable):
        flat = mem.mutable_gpu_data(self.dtype) if mutable else mem.gpu_data(self.dtype)
        return flat[: self._count].reshape(self._shape)

    def cpu_data(self):
        self._touch()
        return self._host(self._data, False)

    def mutable_cpu_data(self):
        self._touch()
        return self._host(self._data, True)

    def cpu_diff(self):
        return self._host(self._diff, False)

    def mutable_cpu_diff(self):
        return self._host(self._diff, True)

    def gpu_data(self):
        self._touch()
        return self._device(self._data, False)

    def mutable_gpu_data(self):
        self._touch()
        return self._device(self._data, True)

    def gpu_diff(self):
        return self._device(self._diff, False)

    def mutable_gpu_diff(self):
        return self._device(self._diff, True)

    def data_xp(self, xp):
        """Read access in the array module `xp` (numpy or cupy): one code path for CPU and GPU."""
        self._touch()
        return self._host(self._data, False) if xp is _np else self._device(self._data, False)

    def mutable_data_xp(self, xp):
        self._touch()
        return self._host(self._data, True) if xp is _np else self._device(self._data, True)

    def diff_xp(self, xp):
        return self._host(self._diff, False) if xp is _np else self._device(self._diff, False)

    def mutable_diff_xp(self, xp):
        return self._host(self._diff, True) if xp is _np else self._device(self._diff, True)

    def set_cpu_data(self, array) -> None:
        """Borrow a host array as this blob's data (it must hold at least count elements of our dtype)."""
        arr = np.ascontiguousarray(array, dtype=self.dtype) if np.asarray(array).dtype != self.dtype else array
        self._lazy = None
        self._data.set_cpu_data(arr)

    @property
    def data(self):
        """pycaffe: a writable NumPy view of the data (the host copy becomes current)."""
        self._touch()
        return self._host(self._data, True)

    @data.setter
    def data(self, value):
        self.mutable_cpu_data()[...] = value

    @property
    def diff(self):
        return self._host(self._diff, True)

    @diff.setter
    def diff(self, value):
        self._host(self._diff, True)[...] = value

    @property
    def data_mem(self):
        self._touch()  # whoever takes the memory may read it
        return self._data

    @property
    def diff_mem(self):
        return self._diff

    def _memories(self):
        """(data, diff) SyncedMemory, without computing pending data (for memory accounting)."""
        return self._data, self._diff

    # -- sharing and copying ---------------------------------------------------
    def share_data(self, Blob other) -> None:
        if self._count != other._count:
            raise ValueError(f"share_data: count mismatch: {self.shape_string()} vs {other.shape_string()}")
        if self.dtype != other.dtype:  # Caffe's Blob<Dtype> can only share with its own type
            raise ValueError(f"share_data: dtype mismatch: {self.dtype.name} vs {other.dtype.name}")
        other._touch()
        self._lazy = None
        self._data = other._data

    def ShareData(self, Blob other) -> None:
        self.share_data(other)

    def share_diff(self, Blob other) -> None:
        if self._count != other._count:
            raise ValueError(f"share_diff: count mismatch: {self.shape_string()} vs {other.shape_string()}")
        if self.dtype != other.dtype:
            raise ValueError(f"share_diff: dtype mismatch: {self.dtype.name} vs {other.dtype.name}")
        self._diff = other._diff

    def ShareDiff(self, Blob other) -> None:
        self.share_diff(other)

    def copy_from(self, Blob source, copy_diff=False, reshape=False) -> None:
        if source._count != self._count or source._shape != self._shape:
            if reshape:
                self.reshape_like(source)
            else:
                raise ValueError(f"copy_from: trying to copy blobs of different sizes: "
                                 f"source {source._shape} vs destination {self._shape}")
        if not copy_diff:
            source._touch()
            if source is not self:
                self._lazy = None  # overwritten whole
        src_mem = source._diff if copy_diff else source._data
        if src_mem.head in (HEAD_AT_GPU, SYNCED) and self._on_gpu_mode():
            dst = self.mutable_gpu_diff() if copy_diff else self.mutable_gpu_data()
            dst[...] = source.gpu_diff() if copy_diff else source.gpu_data()
        else:
            dst = self.mutable_cpu_diff() if copy_diff else self.mutable_cpu_data()
            dst[...] = source.cpu_diff() if copy_diff else source.cpu_data()

    def CopyFrom(self, Blob source, copy_diff=False, reshape=False) -> None:
        self.copy_from(source, copy_diff, reshape)

    @staticmethod
    def _on_gpu_mode():
        from caffe.blob import context
        return context.mode() == context.GPU

    # -- arithmetic, dispatched on where the data is current (as Caffe does) ---
    def _xp_for(self, mem):
        if mem is not None and mem.head in (HEAD_AT_GPU, SYNCED) and mem.head != UNINITIALIZED:
            from caffe.blob import context
            if mem.head == HEAD_AT_GPU or context.mode() == context.GPU:
                import cupy
                return cupy
        return np

    def update(self) -> None:
        """data -= diff, on the device where the data is current."""
        self._touch()
        head = self._data.head
        if head == UNINITIALIZED:
            return
        xp = self._xp_for(self._data)
        data = self.mutable_data_xp(xp)
        data -= self.diff_xp(xp)

    def Update(self) -> None:
        self.update()

    def _reduce(self, mem, fn):
        if mem is None or mem.head == UNINITIALIZED or self._count == 0:
            return 0.0
        xp = self._xp_for(mem)
        arr = self._host(mem, False) if xp is np else self._device(mem, False)
        return float(fn(xp, arr))

    def asum_data(self) -> float:
        self._touch()
        return self._reduce(self._data, lambda xp, a: xp.abs(a).sum())

    def asum_diff(self) -> float:
        return self._reduce(self._diff, lambda xp, a: xp.abs(a).sum())

    def sumsq_data(self) -> float:
        self._touch()
        return self._reduce(self._data, lambda xp, a: xp.vdot(a.ravel(), a.ravel()))

    def sumsq_diff(self) -> float:
        return self._reduce(self._diff, lambda xp, a: xp.vdot(a.ravel(), a.ravel()))

    def scale_data(self, factor) -> None:
        self._touch()
        if self._data.head == UNINITIALIZED:
            return
        xp = self._xp_for(self._data)
        self.mutable_data_xp(xp)[...] *= factor

    def scale_diff(self, factor) -> None:
        if self._diff.head == UNINITIALIZED:
            return
        xp = self._xp_for(self._diff)
        self.mutable_diff_xp(xp)[...] *= factor

    # -- protobuf ---------------------------------------------------------------
    def from_proto(self, proto, reshape=True) -> None:
        """Load a BlobProto (BlobShape or legacy 4-d; float or double; diff if present)."""
        from caffe.blob.proto_io import blob_proto_shape, blob_proto_arrays
        shape = blob_proto_shape(proto)
        if reshape:
            self.reshape(shape)
        elif tuple(shape) != self._shape and not self.shape_equals(proto):
            raise ValueError(f"Trying to copy blobs of different sizes: blob proto has shape {tuple(shape)}, "
                             f"blob has shape {self._shape}")
        data, diff = blob_proto_arrays(proto, self._count)
        if data is not None:
            self._lazy = None  # overwritten whole
            self.mutable_cpu_data().reshape(-1)[...] = data
        if diff is not None:
            self.mutable_cpu_diff().reshape(-1)[...] = diff

    def FromProto(self, proto, reshape=True) -> None:
        self.from_proto(proto, reshape)

    def to_proto(self, write_diff=False, proto=None, *args, **kwargs):
        """to_proto(write_diff=False, proto=None, double=None) ("double" is a C keyword to Cython)."""
        from caffe.blob.proto_io import fill_blob_proto
        double = _double_arg(args, kwargs)
        return fill_blob_proto(self, write_diff=write_diff, proto=proto,
                               double=(self.dtype == np.float64) if double is None else double)

    def ToProto(self, write_diff=False, proto=None, *args, **kwargs):
        return self.to_proto(write_diff, proto, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Blob(shape={self._shape}, dtype={self.dtype.name})"
