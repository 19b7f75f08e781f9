"""glog-style log lines for the solver: "I1130 05:55:11.123456 12345 solver.py:218] message".

The solver logs through logging.getLogger("caffe.solver") (a child of "caffe"); caffe.blob.glog holds the
formatter every package uses (Caffe's parse_log.py reads these lines as it reads Caffe's) and pycaffe's
default handler (stderr, set up by `import caffe`).
"""
from __future__ import annotations

import logging

from caffe.blob.glog import GlogFormatter

__all__ = ["GlogFormatter", "glog_formatter", "init_log"]


def glog_formatter() -> logging.Formatter:
    return GlogFormatter()


def init_log(level=logging.INFO, stream=None) -> logging.Handler:
    """Attach a glog-formatted stream handler to the "caffe" logger (pycaffe's caffe.init_log is
    caffe.blob.glog.init_log; this one writes to any stream)."""
    logger = logging.getLogger("caffe")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(GlogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
