"""Blob: an N-d array with a data and a diff, each backed by a SyncedMemory.

Owns its shape, count and capacity. Reshape grows capacity (new memory) and
never reallocates when shrinking, as in Caffe. Python users see pycaffe's
surface: `.data` / `.diff` are writable NumPy views, `.shape`, `.count`,
`.reshape(*dims)`.
"""
from __future__ import annotations

import numpy as np

from caffe.blob.syncedmem import SyncedMemory, HEAD_AT_CPU, HEAD_AT_GPU, SYNCED, UNINITIALIZED

MAX_BLOB_AXES = 32
_INT_MAX = 2**31 - 1


def _dims(args) -> list[int]:
    """Accept reshape(2, 3), reshape([2, 3]), reshape((2, 3)) or reshape(BlobShape)."""
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
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


class _Count(int):
    """An int that can also be called like Caffe's Blob::count(start, end)."""
    def __new__(cls, value, shape):
        obj = super().__new__(cls, value)
        obj._shape = shape  # the shape, not the blob: no reference cycle keeping blob memory alive
        return obj

    def __call__(self, start: int | None = None, end: int | None = None) -> int:
        if start is None:
            return int(self)
        return _count_range(self._shape, start, end)


class Blob:
    __slots__ = ("_shape", "_count", "_count_obj", "_capacity", "_data", "_diff", "dtype", "__weakref__")

    def __init__(self, *shape, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._shape: tuple[int, ...] = ()
        self._count = 0
        self._count_obj = _Count(0, ())
        self._capacity = 0
        self._data: SyncedMemory | None = None
        self._diff: SyncedMemory | None = None
        if shape:
            self.reshape(*shape)

    # -- shape ---------------------------------------------------------------
    def reshape(self, *shape) -> None:
        dims = _dims(shape)
        if len(dims) > MAX_BLOB_AXES:
            raise ValueError(f"Blob.reshape: {len(dims)} axes exceed the maximum of {MAX_BLOB_AXES}")
        count = 1
        for d in dims:
            if d < 0:
                raise ValueError(f"Blob.reshape: negative dimension in shape {dims}")
            if d and count > _INT_MAX // d:
                raise ValueError(f"Blob.reshape: shape {dims} has more than INT_MAX elements")
            count *= d
        self._shape = tuple(dims)
        self._count_obj = _Count(count, self._shape)
        self._count = count
        if count > self._capacity or self._data is None:
            self._capacity = count
            nbytes = count * self.dtype.itemsize
            self._data = SyncedMemory(nbytes)
            self._diff = SyncedMemory(nbytes)

    Reshape = reshape

    def reshape_like(self, other: "Blob") -> None:
        self.reshape(other._shape)

    ReshapeLike = reshape_like

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def num_axes(self) -> int:
        return len(self._shape)

    @property
    def capacity(self) -> int:
        return self._capacity

    def shape_string(self) -> str:
        return " ".join(str(d) for d in self._shape) + f" ({self._count})"

    @property
    def count(self) -> "_Count":
        """pycaffe's `blob.count` (an int) and Caffe's `count()`, `count(start)`, `count(start, end)`."""
        return self._count_obj

    def count_range(self, start: int, end: int | None = None) -> int:
        """Product of the dims in [start, end) (end defaults to num_axes; a negative start is canonicalized)."""
        return _count_range(self._shape, start, end)

    def canonical_axis_index(self, axis: int) -> int:
        n = self.num_axes
        if not -n <= axis < n:
            raise IndexError(f"axis {axis} out of range for the {n}-d blob with shape {self._shape}")
        return axis + n if axis < 0 else axis

    CanonicalAxisIndex = canonical_axis_index

    def dim(self, axis: int) -> int:
        return self._shape[self.canonical_axis_index(axis)]

    def legacy_shape(self, index: int) -> int:
        if self.num_axes > 4:
            raise ValueError(f"legacy accessors need a blob of <= 4 axes; shape is {self._shape}")
        if not -4 <= index < 4:
            raise IndexError(f"legacy shape index {index} out of range")
        if index >= self.num_axes or index < -self.num_axes:
            return 1
        return self.dim(index)

    num = property(lambda self: self.legacy_shape(0))
    channels = property(lambda self: self.legacy_shape(1))
    height = property(lambda self: self.legacy_shape(2))
    width = property(lambda self: self.legacy_shape(3))

    def offset(self, *indices) -> int:
        idx = _dims(indices) if indices else []
        if len(idx) > self.num_axes:
            raise IndexError(f"offset: {len(idx)} indices for a {self.num_axes}-d blob")
        off = 0
        for axis in range(self.num_axes):
            off *= self._shape[axis]
            if axis < len(idx):
                if not 0 <= idx[axis] < self._shape[axis]:
                    raise IndexError(f"offset: index {idx[axis]} out of range on axis {axis} of {self._shape}")
                off += idx[axis]
        return off

    def shape_equals(self, proto) -> bool:
        if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or proto.HasField("width"):
            if self.num_axes > 4:
                return False
            return (self.legacy_shape(-4), self.legacy_shape(-3), self.legacy_shape(-2),
                    self.legacy_shape(-1)) == (proto.num, proto.channels, proto.height, proto.width)
        return tuple(proto.shape.dim) == self._shape

    # -- memory access -------------------------------------------------------
    def _view(self, mem, fn):
        flat = getattr(mem, fn)(self.dtype)
        return flat[: self._count].reshape(self._shape)

    def cpu_data(self):
        return self._view(self._data, "cpu_data")

    def mutable_cpu_data(self):
        return self._view(self._data, "mutable_cpu_data")

    def cpu_diff(self):
        return self._view(self._diff, "cpu_data")

    def mutable_cpu_diff(self):
        return self._view(self._diff, "mutable_cpu_data")

    def gpu_data(self):
        return self._view(self._data, "gpu_data")

    def mutable_gpu_data(self):
        return self._view(self._data, "mutable_gpu_data")

    def gpu_diff(self):
        return self._view(self._diff, "gpu_data")

    def mutable_gpu_diff(self):
        return self._view(self._diff, "mutable_gpu_data")

    def data_xp(self, xp):
        """Read access in the array module `xp` (numpy or cupy): one code path for CPU and GPU."""
        return self.cpu_data() if xp is np else self.gpu_data()

    def mutable_data_xp(self, xp):
        return self.mutable_cpu_data() if xp is np else self.mutable_gpu_data()

    def diff_xp(self, xp):
        return self.cpu_diff() if xp is np else self.gpu_diff()

    def mutable_diff_xp(self, xp):
        return self.mutable_cpu_diff() if xp is np else self.mutable_gpu_diff()

    def set_cpu_data(self, array) -> None:
        """Borrow a host array as this blob's data (it must hold at least count elements of our dtype)."""
        arr = np.ascontiguousarray(array, dtype=self.dtype) if np.asarray(array).dtype != self.dtype else array
        self._data.set_cpu_data(arr)

    @property
    def data(self) -> np.ndarray:
        """pycaffe: a writable NumPy view of the data (the host copy becomes current)."""
        return self.mutable_cpu_data()

    @data.setter
    def data(self, value) -> None:
        self.mutable_cpu_data()[...] = value

    @property
    def diff(self) -> np.ndarray:
        return self.mutable_cpu_diff()

    @diff.setter
    def diff(self, value) -> None:
        self.mutable_cpu_diff()[...] = value

    @property
    def data_mem(self) -> SyncedMemory:
        return self._data

    @property
    def diff_mem(self) -> SyncedMemory:
        return self._diff

    # -- sharing and copying ---------------------------------------------------
    def share_data(self, other: "Blob") -> None:
        if self._count != other._count:
            raise ValueError(f"share_data: count mismatch: {self.shape_string()} vs {other.shape_string()}")
        self._data = other._data

    ShareData = share_data

    def share_diff(self, other: "Blob") -> None:
        if self._count != other._count:
            raise ValueError(f"share_diff: count mismatch: {self.shape_string()} vs {other.shape_string()}")
        self._diff = other._diff

    ShareDiff = share_diff

    def copy_from(self, source: "Blob", copy_diff: bool = False, reshape: bool = False) -> None:
        if source._count != self._count or source._shape != self._shape:
            if reshape:
                self.reshape_like(source)
            else:
                raise ValueError(f"copy_from: trying to copy blobs of different sizes: "
                                 f"source {source._shape} vs destination {self._shape}")
        src_mem = source._diff if copy_diff else source._data
        if src_mem.head in (HEAD_AT_GPU, SYNCED) and self._on_gpu_mode():
            dst = self.mutable_gpu_diff() if copy_diff else self.mutable_gpu_data()
            dst[...] = source.gpu_diff() if copy_diff else source.gpu_data()
        else:
            dst = self.mutable_cpu_diff() if copy_diff else self.mutable_cpu_data()
            dst[...] = source.cpu_diff() if copy_diff else source.cpu_data()

    CopyFrom = copy_from

    @staticmethod
    def _on_gpu_mode() -> bool:
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
        head = self._data.head
        if head == UNINITIALIZED:
            return
        xp = self._xp_for(self._data)
        data = self.mutable_data_xp(xp)
        data -= self.diff_xp(xp)

    Update = update

    def _reduce(self, mem, fn):
        if mem is None or mem.head == UNINITIALIZED or self._count == 0:
            return 0.0
        xp = self._xp_for(mem)
        arr = self._view(mem, "cpu_data" if xp is np else "gpu_data")
        return float(fn(xp, arr))

    def asum_data(self) -> float:
        return self._reduce(self._data, lambda xp, a: xp.abs(a).sum())

    def asum_diff(self) -> float:
        return self._reduce(self._diff, lambda xp, a: xp.abs(a).sum())

    def sumsq_data(self) -> float:
        return self._reduce(self._data, lambda xp, a: xp.vdot(a.ravel(), a.ravel()))

    def sumsq_diff(self) -> float:
        return self._reduce(self._diff, lambda xp, a: xp.vdot(a.ravel(), a.ravel()))

    def scale_data(self, factor: float) -> None:
        if self._data.head == UNINITIALIZED:
            return
        xp = self._xp_for(self._data)
        self.mutable_data_xp(xp)[...] *= factor

    def scale_diff(self, factor: float) -> None:
        if self._diff.head == UNINITIALIZED:
            return
        xp = self._xp_for(self._diff)
        self.mutable_diff_xp(xp)[...] *= factor

    # -- protobuf ---------------------------------------------------------------
    def from_proto(self, proto, reshape: bool = True) -> None:
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
            self.mutable_cpu_data().reshape(-1)[...] = data
        if diff is not None:
            self.mutable_cpu_diff().reshape(-1)[...] = diff

    FromProto = from_proto

    def to_proto(self, write_diff: bool = False, proto=None, double: bool | None = None):
        from caffe.blob.proto_io import fill_blob_proto
        return fill_blob_proto(self, write_diff=write_diff, proto=proto,
                               double=(self.dtype == np.float64) if double is None else double)

    ToProto = to_proto

    def __repr__(self) -> str:
        return f"Blob(shape={self._shape}, dtype={self.dtype.name})"
