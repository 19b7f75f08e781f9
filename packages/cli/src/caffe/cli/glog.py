"""Caffe's glog line format for Python logging, so users' parse_log scripts keep working.

    I1130 05:55:11.123456 12345 solver.py:218] Iteration 100, loss = 0.25

`setup_logging()` sends the `caffe` logger (and the root logger) to stderr in that
format and, with `log_dir`, also to a glog-named file there (plus the
`<program>.INFO` link glog makes).
"""
from __future__ import annotations

import datetime as _dt
import getpass
import logging
import os
import socket
import sys
import threading

_SEVERITY = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
             logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = _dt.datetime.fromtimestamp(record.created)
        sev = _SEVERITY.get(record.levelno, "I")
        tid = getattr(record, "thread_native", None) or threading.get_native_id()
        prefix = (f"{sev}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {tid % 100000:5d} "
                  f"{record.filename}:{record.lineno}] ")
        msg = record.getMessage()
        if record.exc_info and logging.getLogger("caffe").isEnabledFor(logging.DEBUG):
            msg += "\n" + self.formatException(record.exc_info)
        return prefix + msg


def log_file_name(program: str, start: _dt.datetime | None = None) -> str:
    start = start or _dt.datetime.now()
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return (f"{program}.{socket.gethostname()}.{user}.log.INFO."
            f"{start:%Y%m%d-%H%M%S}.{os.getpid()}")


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
    path = None
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, log_file_name(program))
        fh = logging.FileHandler(path)
        fh.setFormatter(formatter)
        fh._caffe_glog = True
        root.addHandler(fh)
        link = os.path.join(log_dir, f"{program}.INFO")
        try:
            if os.path.islink(link) or os.path.exists(link):
                os.remove(link)
            os.symlink(os.path.basename(path), link)
        except OSError:
            pass
    return path
