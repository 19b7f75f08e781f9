"""glog-style line prefix for the solver's log lines, and C++-style number formatting."""
import io
import logging
import re

from caffe.solver.logging_setup import glog_formatter, init_log
from caffe.solver.solver import fmt


def test_glog_prefix():
    record = logging.LogRecord("caffe.solver", logging.INFO, "/x/solver.py", 218, "Iteration %d, loss = %s",
                               (100, "0.5"), None)
    line = glog_formatter().format(record)
    assert re.fullmatch(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ solver\.py:218\] Iteration 100, loss = 0\.5", line)
    record.levelno = logging.WARNING
    assert glog_formatter().format(record).startswith("W")


def test_init_log_writes_caffe_lines():
    stream = io.StringIO()
    handler = init_log(stream=stream)
    try:
        logging.getLogger("caffe.solver").info("Optimization Done.")
    finally:
        logging.getLogger("caffe").removeHandler(handler)
    assert stream.getvalue().rstrip().endswith("] Optimization Done.")


def test_numbers_print_as_cpp_streams_do():
    assert fmt(2.3130569458007812) == "2.31306"
    assert fmt(0.01) == "0.01"
    assert fmt(1e-5) == "1e-05"
    assert fmt(1234567.0) == "1.23457e+06"
    assert fmt(100.0) == "100"
    assert fmt(float("nan")) == "nan" and fmt(float("inf")) == "inf"
    assert fmt(-float("nan")) == "-nan" and fmt(-float("inf")) == "-inf"  # glibc's printf, as glog shows them


def test_glog_fields_micros_levels_and_tracebacks():
    record = logging.LogRecord("caffe.solver", logging.INFO, "/x/solver.py", 7, "m", (), None)
    record.created = 1_700_000_000.25
    assert ".250000 " in glog_formatter().format(record)
    # levels between the named ones: below WARNING an I, from WARNING on an E (glog has no others)
    record.levelno = 15
    assert glog_formatter().format(record).startswith("I")
    record.levelno = 35
    assert glog_formatter().format(record).startswith("E")
    record.levelno = logging.CRITICAL
    assert glog_formatter().format(record).startswith("F")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    lines = glog_formatter().format(record).split("\n")
    assert lines[0].endswith("] m") and lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
