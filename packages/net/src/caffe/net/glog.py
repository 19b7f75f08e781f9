"""glog-style log lines for Python logging, as Caffe prints them (and log parsers expect):

    I0101 12:00:00.123456 12345 net.py:101] Creating Layer conv1

Level letter, month-day, time with microseconds, thread id, file:line, then the message.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
            logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "I" if record.levelno < logging.WARNING else "E")
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1e6)
        tid = getattr(record, "thread_native", None) or threading.get_native_id()
        head = (f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
                f"{micros:06d} {tid:5d} {record.filename}:{record.lineno}] ")
        text = head + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def install_glog_handler(level: int = logging.INFO, stream=None, logger_name: str = "caffe") -> logging.Handler:
    """Send the `caffe` loggers' records to `stream` (stderr, like glog) in glog format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(GlogFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
