"""Caffe's glog line format for the command-line tools, so users' parse_log scripts keep working.

    I1130 05:55:11.123456 12345 solver.py:218] Iteration 100, loss = 0.25

`setup_logging()` sends the `caffe` logger (and the root logger) to stderr in that format and, with
`log_dir`, also to a file there named as glog names it for the program (`caffe` or `caffe-cli`:
<program>.<host>.<user>.log.INFO.<date>-<time>.<pid>, plus glog's `<program>.INFO` link). The format
itself is caffe.blob.glog's, shared with pycaffe.
"""
from __future__ import annotations

import logging
import sys

from caffe.blob.glog import GlogFormatter as _BaseFormatter, log_file_name, open_log_file

__all__ = ["GlogFormatter", "log_file_name", "setup_logging"]


class GlogFormatter(_BaseFormatter):
    """The shared format; tracebacks only when the `caffe` logger is at DEBUG (the tools' --debug)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and not logging.getLogger("caffe").isEnabledFor(logging.DEBUG):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)


def setup_logging(log_dir: str | None = None, program: str = "caffe-cli", level: int = logging.INFO,
                  stream=None) -> str | None:
    """Configure glog-style logging; returns the log file path when log_dir is given."""
    formatter = GlogFormatter()
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_caffe_glog", False):
            root.removeHandler(h)
            h.close()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    handler._caffe_glog = True
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("caffe").setLevel(level)
    path = None
    if log_dir:
        fh, path = open_log_file(log_dir, program)
        fh.setFormatter(formatter)
        fh._caffe_glog = True
        fh._caffe_default = False
        root.addHandler(fh)
    return path
