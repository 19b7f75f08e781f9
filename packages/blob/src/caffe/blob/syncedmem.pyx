# cython: language_level=3
"""SyncedMemory: lazily allocated memory mirrored between host and device.

Owns (or borrows) one host buffer (a NumPy byte array, pinned when a GPU is in
use) and one device buffer (a CuPy byte array). The head says which copy is
current, with Caffe's four states and transitions:

    UNINITIALIZED --cpu_data/mutable_cpu_data--> HEAD_AT_CPU (zero-filled)
    UNINITIALIZED --gpu_data/mutable_gpu_data--> HEAD_AT_GPU (zero-filled)
    HEAD_AT_CPU   --gpu_data--> SYNCED (copy host->device)
    HEAD_AT_GPU   --cpu_data--> SYNCED (copy device->host)
    any           --mutable_cpu_data--> HEAD_AT_CPU
    any           --mutable_gpu_data--> HEAD_AT_GPU

Data is handed out as typed NumPy/CuPy views of the owned memory, never copies.
"""
import numpy as np

from caffe.blob import context as _ctx
from caffe.blob import memory as _memory

cdef enum Head:
    _UNINITIALIZED = 0
    _HEAD_AT_CPU = 1
    _HEAD_AT_GPU = 2
    _SYNCED = 3

UNINITIALIZED = _UNINITIALIZED
HEAD_AT_CPU = _HEAD_AT_CPU
HEAD_AT_GPU = _HEAD_AT_GPU
SYNCED = _SYNCED
HEAD_NAMES = {0: "UNINITIALIZED", 1: "HEAD_AT_CPU", 2: "HEAD_AT_GPU", 3: "SYNCED"}


cdef object _alloc_host(Py_ssize_t size):
    """Host bytes; pinned (page-locked) when the runtime is in GPU mode, as CaffeMallocHost does.

    A size that cannot fit in the available memory raises BlobMemoryError first: Linux would hand out
    the pages and kill the process (no message) when they are touched.
    """
    if size >= _memory.CHECK_THRESHOLD:
        _memory.check_host_allocation(size, "a blob's host memory")
    if _ctx.mode() == _ctx.GPU and _ctx.gpu_available():
        import cupy
        mem = cupy.cuda.alloc_pinned_memory(max(size, 1))
        buf = np.frombuffer(mem, np.uint8, size)
        return buf
    return np.empty(size, np.uint8)


cdef object _alloc_device(Py_ssize_t size):
    _ctx.require_gpu("SyncedMemory")
    import cupy
    return cupy.empty(size, cupy.uint8)


cdef class SyncedMemory:
    UNINITIALIZED = _UNINITIALIZED
    HEAD_AT_CPU = _HEAD_AT_CPU
    HEAD_AT_GPU = _HEAD_AT_GPU
    SYNCED = _SYNCED

    cdef readonly Py_ssize_t size
    cdef int _head
    cdef object _cpu
    cdef object _gpu
    cdef readonly bint own_cpu_data
    cdef readonly bint own_gpu_data
    cdef readonly int gpu_device
    # Bumped whenever writable access is handed out (mutable_*, set_*): lets caches of values derived
    # from this memory (the Net's inference folding) tell that it may have changed.
    cdef readonly unsigned long long version

    def __cinit__(self, Py_ssize_t size=0):
        if size < 0:
            raise ValueError(f"SyncedMemory size must be >= 0, got {size}")
        self.size = size
        self._head = _UNINITIALIZED
        self._cpu = None
        self._gpu = None
        self.own_cpu_data = False
        self.own_gpu_data = False
        self.gpu_device = -1

    @property
    def head(self):
        return self._head

    @property
    def head_name(self):
        return HEAD_NAMES[self._head]

    def __repr__(self):
        return f"SyncedMemory(size={self.size}, head={HEAD_NAMES[self._head]})"

    # -- transitions ---------------------------------------------------------
    cdef inline void _to_cpu(self) except *:
        if self._head == _UNINITIALIZED:
            self._cpu = _alloc_host(self.size)
            self._cpu[...] = 0
            self.own_cpu_data = True
            self._head = _HEAD_AT_CPU
        elif self._head == _HEAD_AT_GPU:
            if self._cpu is None:
                self._cpu = _alloc_host(self.size)
                self.own_cpu_data = True
            self._gpu.get(out=self._cpu)
            self._head = _SYNCED

    cdef inline void _to_gpu(self) except *:
        if self._head == _UNINITIALIZED:
            self._gpu = _alloc_device(self.size)
            self._gpu.fill(0)
            self.own_gpu_data = True
            self.gpu_device = _ctx.device()
            self._head = _HEAD_AT_GPU
        elif self._head == _HEAD_AT_CPU:
            if self._gpu is None:
                self._gpu = _alloc_device(self.size)
                self.own_gpu_data = True
                self.gpu_device = _ctx.device()
            self._gpu.set(self._cpu)
            self._head = _SYNCED

    # -- host access ---------------------------------------------------------
    def cpu_data(self, dtype=np.uint8):
        """Read-only typed view of the host copy (synced first)."""
        self._to_cpu()
        view = self._cpu.view(dtype)
        view.flags.writeable = False
        return view

    def mutable_cpu_data(self, dtype=np.uint8):
        """Writable typed view of the host copy; the host becomes the only current copy."""
        self._to_cpu()
        self._head = _HEAD_AT_CPU
        self.version += 1
        return self._cpu.view(dtype)

    def set_cpu_data(self, data):
        """Borrow an outside host buffer (C-contiguous, at least `size` bytes); it is not copied. A device buffer
        that was borrowed too is let go (the next upload goes to memory of our own)."""
        arr = np.asarray(data)
        if not arr.flags.c_contiguous:
            raise ValueError("set_cpu_data: the buffer must be C-contiguous")
        if arr.nbytes < self.size:
            raise ValueError(f"set_cpu_data: buffer holds {arr.nbytes} bytes, SyncedMemory needs {self.size}")
        self._cpu = arr.reshape(-1).view(np.uint8)[:self.size]
        self.own_cpu_data = False
        if self._gpu is not None and not self.own_gpu_data:
            # a borrowed device buffer (a prefetched batch's) must not receive this memory's next upload
            self._gpu = None
        self._head = _HEAD_AT_CPU
        self.version += 1

    # -- device access -------------------------------------------------------
    def gpu_data(self, dtype=np.uint8):
        """Typed CuPy view of the device copy (synced first)."""
        self._to_gpu()
        return self._gpu.view(dtype)

    def mutable_gpu_data(self, dtype=np.uint8):
        """Typed CuPy view of the device copy; the device becomes the only current copy."""
        self._to_gpu()
        self._head = _HEAD_AT_GPU
        self.version += 1
        return self._gpu.view(dtype)

    def set_gpu_data(self, data):
        """Borrow an outside CuPy buffer (C-contiguous, at least `size` bytes); it is not copied. A host buffer
        that was borrowed too is let go (the next download goes to memory of our own)."""
        _ctx.require_gpu("set_gpu_data")
        import cupy
        if not isinstance(data, cupy.ndarray):
            raise TypeError("set_gpu_data: expected a cupy.ndarray")
        if not data.flags.c_contiguous:
            raise ValueError("set_gpu_data: the buffer must be C-contiguous")
        if data.nbytes < self.size:
            raise ValueError(f"set_gpu_data: buffer holds {data.nbytes} bytes, SyncedMemory needs {self.size}")
        self._gpu = data.reshape(-1).view(cupy.uint8)[:self.size]
        self.own_gpu_data = False
        self.gpu_device = data.device.id
        if self._cpu is not None and not self.own_cpu_data:
            # a borrowed host buffer (a prefetched batch's) must not receive this memory's next download
            self._cpu = None
        self._head = _HEAD_AT_GPU
        self.version += 1

    def async_gpu_push(self, stream=None):
        """Start the host->device copy on `stream` (pinned host memory makes it asynchronous)."""
        if self._head != _HEAD_AT_CPU:
            raise RuntimeError(f"async_gpu_push needs head HEAD_AT_CPU, head is {HEAD_NAMES[self._head]}")
        if self._gpu is None:
            self._gpu = _alloc_device(self.size)
            self.own_gpu_data = True
            self.gpu_device = _ctx.device()
        self._gpu.set(self._cpu, stream=stream)
        self._head = _SYNCED
