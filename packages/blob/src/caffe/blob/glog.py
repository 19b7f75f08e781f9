"""Caffe's log lines (glog) for Python logging: one format and pycaffe's defaults, for every package.

    I1130 05:55:11.123456 12345 solver.py:218] Iteration 100, loss = 0.25

Severity letter, month-day, time with microseconds, thread id, file:line, message: the lines Caffe's
log parsers (parse_log, plot_training_log) read.

pycaffe prints what Caffe prints: `import caffe` attaches a handler to the `caffe` logger that writes
these lines to stderr (as glog does before InitGoogleLogging), at the level GLOG_minloglevel gives
(0 INFO, 1 WARNING, 2 ERROR, 3 FATAL), so Net construction and solver.solve()/step() show their lines
in a notebook without any logging setup. The handler steps aside when the application has configured
logging itself (handlers on the root logger, as caffe-cli, logging.basicConfig or pytest do): the lines
then reach those handlers instead, never twice.

`init_log(level, stderr)` is pycaffe's caffe.init_log (InitGoogleLogging): `level` sets the minimum
level; without stderr=True, glog's defaults apply: lines go to a glog-named file in GLOG_log_dir (or
the temp directory) and only ERROR and above (GLOG_stderrthreshold) to stderr, unless
GLOG_logtostderr=1 (GLOG_alsologtostderr=1 keeps both).
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import threading

LOGGER = "caffe"
_SEVERITY = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
             logging.CRITICAL: "F"}
# glog's levels (FLAGS_minloglevel, GLOG_stderrthreshold) -> Python's
GLOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


class GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = _dt.datetime.fromtimestamp(record.created)
        sev = _SEVERITY.get(record.levelno, "I" if record.levelno < logging.WARNING else "E")
        tid = getattr(record, "thread_native", None) or threading.get_native_id()
        text = (f"{sev}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {tid % 100000:5d} "
                f"{record.filename}:{record.lineno}] {record.getMessage()}")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "t", "yes", "y")


def glog_level(level: int) -> int:
    """A glog level (0..3) as a Python logging level."""
    return GLOG_LEVELS.get(int(level), logging.CRITICAL if int(level) > 3 else logging.INFO)


def env_level() -> int:
    """The Python level GLOG_minloglevel asks for (INFO when unset)."""
    return glog_level(_env_int("GLOG_minloglevel", 0))


class _StderrHandler(logging.StreamHandler):
    """glog lines to whatever sys.stderr is at the time (a notebook or pytest may swap it)."""

    def __init__(self, defer_to_root: bool, level: int = logging.NOTSET):
        super().__init__(sys.stderr)
        self.defer_to_root = defer_to_root
        self.setLevel(level)
        self.setFormatter(GlogFormatter())
        self._caffe_default = True

    def emit(self, record):
        if self.defer_to_root and logging.getLogger().handlers:
            return  # the application configured logging: its handlers print the line
        if self.stream is not sys.stderr:
            self.stream = sys.stderr
        super().emit(record)


def log_file_name(program: str, start: _dt.datetime | None = None, severity: str = "INFO") -> str:
    """glog's file name: <program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>."""
    import getpass
    import socket  # both only when a log file is named: `import caffe` stays light
    start = start or _dt.datetime.now()
    try:
        user = getpass.getuser()
    except Exception:
        user = "invalid-user"
    return f"{program}.{socket.gethostname()}.{user}.log.{severity}.{start:%Y%m%d-%H%M%S}.{os.getpid()}"


def program_name() -> str:
    """The running program's short name, as glog names log files for it."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
    return os.path.basename(argv0) or "python"


def open_log_file(log_dir: str, program: str) -> tuple[logging.Handler, str]:
    """A handler writing glog lines to a glog-named file in log_dir, plus glog's <program>.INFO link."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, log_file_name(program))
    handler = logging.FileHandler(path)
    handler.setFormatter(GlogFormatter())
    handler._caffe_default = True
    link = os.path.join(log_dir, f"{program}.INFO")
    try:
        if os.path.islink(link) or os.path.exists(link):
            os.remove(link)
        os.symlink(os.path.basename(path), link)
    except OSError:
        pass  # a link is a convenience; a read-only or link-less file system keeps the file
    return handler, path


_lock = threading.Lock()


def _remove_defaults(logger: logging.Logger) -> None:
    for h in list(logger.handlers):
        if getattr(h, "_caffe_default", False):
            logger.removeHandler(h)
            h.close()


def install_default() -> None:
    """pycaffe's default (glog before InitGoogleLogging): every line to stderr, GLOG_minloglevel
    respected. Idempotent; leaves a level the application has set on the `caffe` logger alone."""
    logger = logging.getLogger(LOGGER)
    with _lock:
        if any(getattr(h, "_caffe_default", False) for h in logger.handlers):
            return
        if logger.level == logging.NOTSET:
            logger.setLevel(env_level())
        logger.addHandler(_StderrHandler(defer_to_root=True))


def init_log(level: int | None = None, stderr: bool | None = None) -> str | None:
    """pycaffe's caffe.init_log([level[, stderr]]): InitGoogleLogging with FLAGS_minloglevel = level
    and FLAGS_logtostderr = stderr. Returns the log file's path when lines go to a file."""
    logger = logging.getLogger(LOGGER)
    to_stderr = _env_bool("GLOG_logtostderr") if stderr is None else bool(stderr)
    with _lock:
        _remove_defaults(logger)
        logger.setLevel(glog_level(level) if level is not None else env_level())
        if to_stderr:
            logger.addHandler(_StderrHandler(defer_to_root=False))
            return None
        import tempfile
        log_dir = os.environ.get("GLOG_log_dir") or tempfile.gettempdir()
        handler, path = open_log_file(log_dir, program_name())
        logger.addHandler(handler)
        threshold = logging.NOTSET if _env_bool("GLOG_alsologtostderr") else \
            glog_level(_env_int("GLOG_stderrthreshold", 2))
        logger.addHandler(_StderrHandler(defer_to_root=False, level=threshold))
        return path


def log(message: str) -> None:
    """pycaffe's caffe.log(s): one INFO line in Caffe's log."""
    logging.getLogger(LOGGER).info("%s", message, stacklevel=2)
