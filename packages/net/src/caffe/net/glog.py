"""glog-style log lines (caffe.blob.glog holds the one formatter every package uses):

    I0101 12:00:00.123456 12345 net.py:101] Creating Layer conv1
"""
from __future__ import annotations

import logging
import sys

from caffe.blob.glog import GlogFormatter

__all__ = ["GlogFormatter", "install_glog_handler"]


def install_glog_handler(level: int = logging.INFO, stream=None, logger_name: str = "caffe") -> logging.Handler:
    """Send the `caffe` loggers' records to `stream` (stderr, like glog) in glog format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(GlogFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
