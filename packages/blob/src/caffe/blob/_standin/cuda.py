"""Stand-in for `cupy.cuda`: fake devices, streams, events, memory pointers, pinned memory.

Every stand-in operation runs synchronously on the host, so streams and events only keep CuPy's
bookkeeping (current stream per thread and device, `ptr`, `done`, elapsed time between events).
"""
from __future__ import annotations

import time

import numpy as np

from caffe.blob._standin import _state, runtime
from caffe.blob._standin._memory import registry, transfers
from caffe.blob._standin.runtime import CUDARuntimeError  # noqa: F401  (cupy.cuda re-exports it)


def is_available() -> bool:
    return _state.device_count() > 0


# --------------------------------------------------------------------------------------- devices

class Device:
    """`cupy.cuda.Device(id)`; `Device()` is the current device. A context manager that makes it current."""

    def __init__(self, device=None):
        if device is None:
            device = _state.current_device()
        elif isinstance(device, Device):
            device = device.id
        self.id = int(device)
        self._prev: list[int] = []

    def use(self) -> None:
        runtime.setDevice(self.id)

    def synchronize(self) -> None:
        runtime.check_device(self.id)

    def __enter__(self):
        runtime.check_device(self.id)
        self._prev.append(_state.current_device())
        _state.set_current_device(self.id)
        return self

    def __exit__(self, *exc):
        _state.set_current_device(self._prev.pop())
        return False

    @property
    def compute_capability(self) -> str:
        return "00"

    @property
    def mem_info(self) -> tuple[int, int]:
        with self:
            return runtime.memGetInfo()

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{self.id:02x}:00.0"

    def __int__(self):
        return self.id

    __index__ = __int__

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("standin-device", self.id))

    def __repr__(self):
        return f"<CUDA Device {self.id} (CuPy stand-in)>"


# --------------------------------------------------------------------------------------- streams, events

class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.ptr = _state.new_handle()
        self.disable_timing = disable_timing
        self._time = None

    def record(self, stream=None) -> None:
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return True


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (host time: the stand-in runs synchronously)."""
    if start._time is None or end._time is None:
        raise CUDARuntimeError(600, "cudaErrorNotReady: an event was not recorded")
    if start.disable_timing or end.disable_timing:
        raise CUDARuntimeError(6, "cudaErrorInvalidResourceHandle: an event was created with disable_timing")
    return (end._time - start._time) * 1e3


class _BaseStream:
    ptr = 0

    def __init__(self):
        self.device_id = _state.current_device()

    def synchronize(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return True

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        pass

    def use(self):
        stack = _state.stream_stack(self.device_id)
        if stack:
            stack[-1] = self
        else:
            stack.append(self)
        return self

    def __enter__(self):
        _state.stream_stack(self.device_id).append(self)
        return self

    def __exit__(self, *exc):
        _state.stream_stack(self.device_id).pop()
        return False

    def __eq__(self, other):
        return isinstance(other, _BaseStream) and other.ptr == self.ptr and other.device_id == self.device_id

    def __hash__(self):
        return hash((self.ptr, self.device_id))

    def __repr__(self):
        return f"<{type(self).__name__} {self.ptr:#x} (device {self.device_id}, CuPy stand-in)>"


class Stream(_BaseStream):
    """`cupy.cuda.Stream(null=False, non_blocking=False, ptds=False, priority=None)`."""

    null: "Stream"

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority=None):
        super().__init__()
        self.ptr = 0 if null else _state.new_handle()
        self.non_blocking = non_blocking


class ExternalStream(_BaseStream):
    def __init__(self, ptr: int, device_id: int = -1):
        super().__init__()
        self.ptr = int(ptr)
        if device_id >= 0:
            self.device_id = device_id


Stream.null = Stream(null=True)


def get_current_stream(device_id: int = -1) -> _BaseStream:
    device_id = _state.current_device() if device_id < 0 else int(device_id)
    stack = _state.stream_stack(device_id)
    if stack:
        return stack[-1]
    s = Stream(null=True)
    s.device_id = device_id
    return s


# --------------------------------------------------------------------------------------- memory

class Memory:
    """One fake device allocation (its bytes are a NumPy uint8 array)."""

    def __init__(self, size: int):
        self.size = int(size)
        self.device_id = _state.current_device()
        runtime.check_device(self.device_id)
        self._owner = np.zeros(max(self.size, 1), np.uint8)
        registry.device_of(self._owner, self.device_id)
        self.ptr = int(self._owner.__array_interface__["data"][0])


class MemoryPointer:
    """A device address: `ptr` (int), `device_id`, `mem`; `mp + n` offsets it."""

    def __init__(self, mem, offset: int):
        self.mem = mem
        self.device_id = mem.device_id
        self.ptr = mem.ptr + int(offset)

    @property
    def device(self) -> Device:
        return Device(self.device_id)

    def __add__(self, offset: int) -> "MemoryPointer":
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + int(offset))

    def __int__(self):
        return self.ptr

    def _bytes(self, size: int) -> np.ndarray:
        return registry.resolve(self.ptr, size, "MemoryPointer")[0]

    def copy_from_host(self, src_ptr: int, size: int) -> None:
        runtime.memcpy(self.ptr, src_ptr, size, runtime.memcpyHostToDevice)

    def copy_to_host(self, dst_ptr: int, size: int) -> None:
        runtime.memcpy(dst_ptr, self.ptr, size, runtime.memcpyDeviceToHost)

    def copy_from_device(self, src: "MemoryPointer", size: int) -> None:
        self._bytes(size)[...] = src._bytes(size)
        if src.device_id != self.device_id:
            transfers.record("p2p", size)

    def memset(self, value: int, size: int) -> None:
        self._bytes(size)[...] = value

    copy_from_host_async = copy_from_host
    copy_to_host_async = copy_to_host
    copy_from_device_async = copy_from_device
    memset_async = memset


class _ArrayMemory:
    """`mem` of an array's MemoryPointer: keeps the array's owning buffer alive."""

    def __init__(self, owner: np.ndarray, device_id: int):
        self.owner = owner
        self.device_id = device_id
        self.ptr = int(owner.__array_interface__["data"][0])
        self.size = owner.nbytes


def alloc(size: int) -> MemoryPointer:
    return MemoryPointer(Memory(size), 0)


class MemoryPool:
    """`cupy.get_default_memory_pool()`: what the stand-in's live device arrays hold."""

    def used_bytes(self) -> int:
        return registry.used_bytes()

    def total_bytes(self) -> int:
        return registry.used_bytes()

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self, stream=None) -> None:
        pass

    def n_free_blocks(self) -> int:
        return 0

    def set_limit(self, size=None, fraction=None) -> None:
        pass

    def get_limit(self) -> int:
        return 0

    def malloc(self, size: int) -> MemoryPointer:
        return alloc(size)


class PinnedMemory(bytearray):
    """Page-locked host memory stand-in: plain host bytes (it supports the buffer protocol)."""


def alloc_pinned_memory(size: int) -> PinnedMemory:
    return PinnedMemory(int(size))


class PinnedMemoryPool:
    def free_all_blocks(self) -> None:
        pass

    def n_free_blocks(self) -> int:
        return 0

    def malloc(self, size: int) -> PinnedMemory:
        return alloc_pinned_memory(size)


def set_allocator(allocator=None) -> None:
    pass


def set_pinned_memory_allocator(allocator=None) -> None:
    pass
