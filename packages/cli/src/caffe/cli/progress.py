"""The training progress bar (tqdm) on stderr, only when stderr is a terminal.

Log lines and the bar share stderr: while the bar is up, the console handlers of the root logger
(where caffe-cli sends Caffe's glog lines) write through tqdm (tqdm.contrib.logging), which clears
the bar, writes each line whole and redraws the bar, so the log stays line-for-line parseable.
"""
from __future__ import annotations

import logging
import sys


class Progress:
    def __init__(self, total: int, stream=None, initial: int = 0, disable: bool | None = None):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm
        self.stream = stream or sys.stderr
        self.bar = tqdm(total=max(int(total), 1), initial=int(initial), file=self.stream, disable=disable,
                        unit="iter", desc="Training", dynamic_ncols=True, leave=False)
        self._redirect = logging_redirect_tqdm(loggers=[logging.getLogger()], tqdm_class=tqdm)
        self._redirect.__enter__()
        self._closed = False

    @classmethod
    def attach(cls, solver, total: int, stream=None, force: bool = False):
        """Hook a bar onto `solver` (advanced at each on_gradients_ready) if stderr is a terminal;
        it counts from the solver's current iteration (a resumed run) to `total` (max_iter)."""
        stream = stream or sys.stderr
        if not force and not (hasattr(stream, "isatty") and stream.isatty()):
            return None
        bar = cls(total, stream, initial=getattr(solver, "iter", 0), disable=False)
        solver.add_callback(lambda: None, bar.step)
        return bar

    @property
    def done(self) -> int:
        return self.bar.n

    def step(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._redirect.__exit__(None, None, None)
            self.bar.close()
