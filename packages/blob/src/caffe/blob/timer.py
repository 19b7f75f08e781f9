"""Caffe's Timer (util/benchmark.hpp), pycaffe's caffe.Timer: start(), stop(), ms.

In GPU mode the device is synchronized at start and stop, so the time covers the kernels launched in
between (Caffe times GPU work with CUDA events to the same effect).
"""
from __future__ import annotations

import time

from caffe.blob import context


def _sync() -> None:
    if context.mode() == context.GPU:
        import cupy
        cupy.cuda.Device().synchronize()


class Timer:
    def __init__(self):
        self._running = False
        self._has_run = False
        self._start = 0.0
        self._elapsed = 0.0

    def start(self) -> None:
        if not self._running:
            _sync()
            self._start = time.perf_counter()
            self._running = True
            self._has_run = True

    def stop(self) -> None:
        if self._running:
            _sync()
            self._elapsed = time.perf_counter() - self._start
            self._running = False

    @property
    def running(self) -> bool:
        return self._running

    @property
    def has_run_at_least_once(self) -> bool:
        return self._has_run

    def _seconds(self) -> float:
        if not self._has_run:
            return 0.0
        if self._running:
            self.stop()  # Caffe's MilliSeconds() stops a running timer
        return self._elapsed

    @property
    def ms(self) -> float:
        """Milliseconds between the last start() and stop()."""
        return self._seconds() * 1e3

    # Caffe's C++ names
    Start = start
    Stop = stop

    def MilliSeconds(self) -> float:
        return self.ms

    def MicroSeconds(self) -> float:
        return self._seconds() * 1e6

    def Seconds(self) -> float:
        return self._seconds()
