"""A progress bar with ETA on stderr while training, only when stderr is a terminal.

Log lines and the bar share stderr: the bar redraws itself on one line (carriage return) and
is cleared before each log record, so the log stays parseable.
"""
from __future__ import annotations

import logging
import sys
import time


class Progress:
    def __init__(self, total: int, stream=None):
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._shown = False
        self._handler = _ClearingFilter(self)
        for h in logging.getLogger().handlers:
            h.addFilter(self._handler)

    @classmethod
    def attach(cls, solver, total: int, stream=None, force: bool = False):
        """Hook a bar onto `solver` (advanced at each on_gradients_ready) if stderr is a terminal."""
        stream = stream or sys.stderr
        if not force and not (hasattr(stream, "isatty") and stream.isatty()):
            return None
        bar = cls(total - getattr(solver, "iter", 0), stream)
        solver.add_callback(lambda: None, bar.step)
        return bar

    def render(self) -> str:
        frac = min(self.done / self.total, 1.0)
        width = 30
        filled = int(frac * width)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta_s = f"{eta:5.1f}s" if eta == eta else "  ?  "
        return f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} ETA {eta_s}"

    def step(self) -> None:
        self.done += 1
        self.stream.write(self.render())
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self._shown = False

    def close(self) -> None:
        self.clear()
        for h in logging.getLogger().handlers:
            h.removeFilter(self._handler)


class _ClearingFilter(logging.Filter):
    def __init__(self, bar: Progress):
        super().__init__()
        self.bar = bar

    def filter(self, record) -> bool:
        self.bar.clear()
        return True
