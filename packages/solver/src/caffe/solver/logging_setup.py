"""glog-style log lines for Python logging: "I1130 05:55:11.123456 12345 solver.py:218] message".

The solver logs through logging.getLogger("caffe.solver") (a child of "caffe"); a
handler with glog_formatter() gives Caffe's line prefix, so tools such as Caffe's
parse_log.py read the training log as they read Caffe's.
"""
from __future__ import annotations

import logging
import os
import time

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
                 logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1e6)
        letter = _LEVEL_LETTER.get(record.levelno, "I" if record.levelno < logging.WARNING else "E")
        prefix = (f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
                  f"{micros:06d} {record.process or os.getpid():>5d} "
                  f"{record.filename}:{record.lineno}] ")
        text = prefix + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def glog_formatter() -> logging.Formatter:
    return GlogFormatter()


def init_log(level=logging.INFO, stream=None) -> logging.Handler:
    """Attach a glog-formatted stream handler to the "caffe" logger (pycaffe's caffe.init_log)."""
    logger = logging.getLogger("caffe")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(GlogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
