"""Fake device memory: which host buffers are "device allocations", on which fake device, and the
count of every host<->device transfer.

Device arrays are NumPy arrays underneath; their memory is registered here (by its owning NumPy array)
with the fake device it lives on, so a raw pointer (`arr.data.ptr`, as NCCL and memcpy take) can be
checked and resolved, and so a view of device memory stays on that device.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import threading
import traceback
import weakref
from collections import Counter

import numpy as np


# --------------------------------------------------------------------------------------- transfers

class TransferCounter:
    """Counts host->device ("h2d"), device->host ("d2h") and device->device across devices ("p2p")
    copies with their bytes. `snapshot()` is a plain dict; `counting()` measures a block:

        with transfers.counting() as delta:
            net.ForwardBackward()
        assert delta["d2h"] == 0

    `counting(this_thread=True)` counts only the copies made by the calling thread (so a test can tell
    a prefetch thread's uploads from the training loop's). With `trace=True` (or CAFFE_STANDIN_TRACE=1)
    each event also records the caller outside the stand-in, in `events` (kind, nbytes, "file:line in
    function", thread name).
    """

    KINDS = ("h2d", "d2h", "p2p")

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._by_thread: dict[int, Counter] = {}
        self.trace = bool(os.environ.get("CAFFE_STANDIN_TRACE"))
        self.events: list[tuple[str, int, str, str]] = []

    def record(self, kind: str, nbytes: int) -> None:
        me = threading.get_ident()
        with self._lock:
            mine = self._by_thread.setdefault(me, Counter())
            for c in (self._counts, mine):
                c[kind] += 1
                c[kind + "_bytes"] += int(nbytes)
            if self.trace:
                self.events.append((kind, int(nbytes), _caller(), threading.current_thread().name))

    def snapshot(self, this_thread: bool = False) -> dict:
        with self._lock:
            out = {k: 0 for k in self.KINDS}
            out.update({k + "_bytes": 0 for k in self.KINDS})
            out.update(self._by_thread.get(threading.get_ident(), {}) if this_thread else self._counts)
            return out

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._by_thread.clear()
            self.events.clear()

    def counting(self, this_thread: bool = False):
        return _Delta(self, this_thread)

    def __getitem__(self, kind: str) -> int:
        return self.snapshot()[kind]

    def __repr__(self):
        s = self.snapshot()
        return "TransferCounter(" + ", ".join(f"{k}={s[k]} ({s[k + '_bytes']} B)" for k in self.KINDS) + ")"


class _Delta(dict):
    """The transfers made inside a `with counter.counting() as delta:` block (filled in at exit)."""

    def __init__(self, counter: TransferCounter, this_thread: bool):
        super().__init__()
        self._counter, self._this_thread = counter, this_thread

    def __enter__(self):
        self._start = self._counter.snapshot(self._this_thread)
        self._n_events = len(self._counter.events)
        return self

    def __exit__(self, *exc):
        end = self._counter.snapshot(self._this_thread)
        self.update({k: end[k] - self._start.get(k, 0) for k in end})
        self.events = self._counter.events[self._n_events:]
        return False


_HERE = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_HERE):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "?"


transfers = TransferCounter()


# --------------------------------------------------------------------------------------- allocations

class _Allocation:
    __slots__ = ("start", "end", "device", "ref")

    def __init__(self, owner: np.ndarray, device: int):
        self.start = int(owner.__array_interface__["data"][0])
        self.end = self.start + owner.nbytes
        self.device = device
        self.ref = weakref.ref(owner)


class Registry:
    """Device allocations by their owning NumPy array (a view's `.base`), with their fake device."""

    def __init__(self):
        self._lock = threading.RLock()
        self._by_owner: dict[int, _Allocation] = {}  # id(owner) -> allocation
        self._starts: list[int] = []  # sorted starts, rebuilt lazily for pointer look-ups
        self._by_start: dict[int, _Allocation] = {}
        self._dirty = True

    @staticmethod
    def owner_of(arr: np.ndarray):
        base = arr
        while isinstance(base.base, np.ndarray):
            base = base.base
        return base

    def _forget(self, key: int) -> None:
        with self._lock:
            self._by_owner.pop(key, None)
            self._dirty = True

    def device_of(self, arr: np.ndarray, default: int) -> int:
        """The fake device of `arr`'s memory; memory seen for the first time is placed on `default`."""
        owner = self.owner_of(arr)
        key = id(owner)
        with self._lock:
            alloc = self._by_owner.get(key)
            if alloc is not None and alloc.ref() is owner:
                return alloc.device
            alloc = _Allocation(owner, default)
            self._by_owner[key] = alloc
            weakref.finalize(owner, self._forget, key)
            self._dirty = True
            return default

    def used_bytes(self, device: int | None = None) -> int:
        with self._lock:
            return sum(a.end - a.start for a in self._by_owner.values()
                       if a.ref() is not None and (device is None or a.device == device))

    def resolve(self, ptr: int, nbytes: int, what: str) -> tuple[np.ndarray, int]:
        """A uint8 NumPy view of `nbytes` device bytes at `ptr`, and their device; ValueError when the
        range is not inside one live device allocation (a host pointer, a freed buffer, an overrun)."""
        ptr, nbytes = int(ptr), int(nbytes)
        with self._lock:
            if self._dirty:
                self._by_start = {a.start: a for a in self._by_owner.values() if a.ref() is not None}
                self._starts = sorted(self._by_start)
                self._dirty = False
            i = bisect.bisect_right(self._starts, ptr) - 1
            alloc = self._by_start.get(self._starts[i]) if i >= 0 else None
            owner = alloc.ref() if alloc is not None else None
        if owner is None or not (alloc.start <= ptr and ptr + nbytes <= alloc.end):
            raise ValueError(f"{what}: pointer {ptr:#x} (+{nbytes} bytes) is not inside a device allocation of the "
                             "CuPy stand-in (a host pointer, a freed array, or past the end of one)")
        flat = owner.reshape(-1).view(np.uint8) if owner.flags.c_contiguous else None
        if flat is None:
            raise ValueError(f"{what}: the allocation at {ptr:#x} is not contiguous")
        off = ptr - alloc.start
        return flat[off:off + nbytes], alloc.device

    def is_device_pointer(self, ptr: int) -> bool:
        try:
            self.resolve(ptr, 0, "")
            return True
        except ValueError:
            return False


registry = Registry()


def host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 view of host memory at a raw address (for runtime.memcpy's host side)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    buf = (ctypes.c_uint8 * int(nbytes)).from_address(int(ptr))
    return np.ctypeslib.as_array(buf)
