"""caffe.blob.glog: Caffe's line format, pycaffe's default (lines on stderr after `import caffe`,
GLOG_minloglevel respected, stepping aside for an application's own logging), caffe.init_log and
caffe.log; and caffe.Timer. Default-handler behaviour is checked in fresh interpreters, since pytest
configures logging itself."""
import logging
import os
import re
import subprocess
import sys
import time

import caffe
from caffe.blob.glog import GlogFormatter, glog_level, log_file_name

LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ ([\w.<>-]+):(\d+)\] (.*)$")


def run(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("GLOG_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full)


def glog_lines(text):
    return [m.groups() for m in map(LINE.match, text.splitlines()) if m]


def test_format():
    rec = logging.LogRecord("caffe.net", logging.WARNING, "/x/net.py", 12, "Creating Layer %s", ("conv1",), None)
    line = GlogFormatter().format(rec)
    assert LINE.match(line).groups() == ("W", "net.py", "12", "Creating Layer conv1")
    assert [glog_level(i) for i in range(4)] == [logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL]
    name = log_file_name("caffe")
    assert re.fullmatch(rf"caffe\.[^.]+.*\.log\.INFO\.\d{{8}}-\d{{6}}\.{os.getpid()}", name)


BODY = ("logging.getLogger('caffe.net').info('info line')\n"
        "logging.getLogger('caffe.solver').warning('warning line')\n"
        "caffe.log('from caffe.log')\n")
CODE = "import logging, caffe\n" + BODY


def test_default_lines_on_stderr_and_minloglevel():
    out = run(CODE)
    assert out.returncode == 0, out.stderr
    lines = glog_lines(out.stderr)
    assert [(s, m) for s, _, _, m in lines] == [("I", "info line"), ("W", "warning line"), ("I", "from caffe.log")]
    assert lines[2][1] == "<string>"  # caffe.log names its caller's file, as a LOG(INFO) there would
    assert out.stdout == ""
    quiet = run(CODE, GLOG_minloglevel="1")
    assert [(s, m) for s, _, _, m in glog_lines(quiet.stderr)] == [("W", "warning line")]


def test_steps_aside_for_the_applications_logging():
    out = run("import logging; logging.basicConfig(format='APP %(message)s', level=logging.INFO)\n" + CODE)
    assert out.stderr.splitlines() == ["APP info line", "APP warning line", "APP from caffe.log"]  # once each


def test_init_log_levels_and_files(tmp_path):
    out = run("import logging, caffe\ncaffe.init_log(1, True)\n" + BODY)
    assert [m for *_, m in glog_lines(out.stderr)] == ["warning line"]
    # glog's InitGoogleLogging: lines to a file named for the program, errors also on stderr
    out = run("import logging, caffe\ncaffe.init_log()\n" + BODY
              + "logging.getLogger('caffe').error('error line')\n", GLOG_log_dir=str(tmp_path))
    assert [m for *_, m in glog_lines(out.stderr)] == ["error line"]
    files = [p for p in tmp_path.iterdir() if ".log.INFO." in p.name]
    assert len(files) == 1 and files[0].name.startswith("python.")
    assert [m for *_, m in glog_lines(files[0].read_text())] == ["info line", "warning line", "from caffe.log",
                                                                 "error line"]
    assert (tmp_path / "python.INFO").is_symlink()
    out = run("import logging, caffe\ncaffe.init_log(0)\n" + BODY, GLOG_logtostderr="1", GLOG_log_dir=str(tmp_path))
    assert len(glog_lines(out.stderr)) == 3 and len(list(tmp_path.glob("*.log.INFO.*"))) == 1  # no new file


def test_timer():
    t = caffe.Timer()
    assert t.ms == 0.0 and not t.has_run_at_least_once
    t.start()
    time.sleep(0.02)
    t.stop()
    first = t.ms
    assert 15 <= first < 2000 and t.ms == first  # stopped: reading again gives the same time
    assert abs(t.MilliSeconds() - first) < 1e-9 and abs(t.Seconds() * 1e3 - first) < 1e-9
    t.start()
    assert t.running
    assert t.ms >= 0 and not t.running  # reading a running timer stops it, as Caffe's MilliSeconds()
