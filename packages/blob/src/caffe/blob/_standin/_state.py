"""Per-thread fake-device state: the current device and the current stream of each device."""
from __future__ import annotations

import itertools
import os
import threading

_local = threading.local()
_ptrs = itertools.count(0x5000)  # fake handles for streams and events (never 0: 0 is the null stream)


def device_count() -> int:
    raw = os.environ.get("CAFFE_CUPY_STANDIN_DEVICES", "2")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"CAFFE_CUPY_STANDIN_DEVICES must be an integer, got {raw!r}") from None
    return max(0, n)


def current_device() -> int:
    return getattr(_local, "device", 0)


def set_current_device(i: int) -> None:
    _local.device = int(i)


def stream_stack(device: int) -> list:
    stacks = getattr(_local, "streams", None)
    if stacks is None:
        stacks = _local.streams = {}
    return stacks.setdefault(device, [])


def new_handle() -> int:
    return next(_ptrs) * 16
