"""Helpers for the tests that run ranks under mpiexec (imported by path; not a test module)."""
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def mpiexec_path():
    cand = Path(sys.executable).parent / "mpiexec"
    if cand.exists():
        return str(cand)
    return shutil.which("mpiexec")


def require_mpiexec():
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (pip install 'caffe-parallel[mpi]' puts it in the venv)")
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install 'caffe-parallel[mpi]')")
    return exe


# A job still running after this long is hung: the guard that turns a hang into a failure, not a timing
# assertion (the jobs take seconds; under heavy load a minute). How fast a fault ends a job is checked
# against the job's own measured pace instead (see Run.after_fault).
HANG_GUARD = 300.0


class Run:
    """What one mpiexec job did: returncode, stdout, stderr, seconds; `fault_at` (seconds from launch to the
    line announcing an injected fault, None without one) and `after_fault` (seconds from it to the job's end)."""

    def __init__(self, returncode, out, err, seconds, fault_at):
        self.returncode, self.out, self.err, self.seconds, self.fault_at = returncode, out, err, seconds, fault_at
        self.after_fault = None if fault_at is None else seconds - fault_at

    def __iter__(self):  # rc, out, err, secs = run_mpi(...)
        return iter((self.returncode, self.out, self.err, self.seconds))

    def ended_promptly_after_fault(self, watchdog_timeout: float = 0.0) -> bool:
        """The job ended soon after its fault, measured against its own pace: a watchdog timeout plus a few
        times what the job needed to start and reach the fault (the machine's current speed), so a loaded
        machine is never taken for a hang, while a job left to a 600 s sleep or the 1800 s default is."""
        assert self.fault_at is not None, f"the fault was never announced:\n{self.err}"
        return self.after_fault <= watchdog_timeout + max(20.0, 5 * self.fault_at)


def run_mpi(n, args, timeout=HANG_GUARD, mpi_flags=(), env=None, fault_marker="injects a fault"):
    """Run `python args...` on n ranks. Returns a Run (unpacks as returncode, stdout, stderr, seconds)."""
    exe = require_mpiexec()
    full_env = dict(os.environ)
    full_env.pop("CAFFE_PARALLEL_TIMEOUT", None)
    full_env.update(env or {})
    cmd = [exe, *mpi_flags, "-n", str(n), sys.executable, *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                         cwd=str(HERE))
    out, err, fault_at = [], [], []

    def pump(stream, lines, watch):
        for line in stream:
            if watch and not fault_at and fault_marker in line:
                fault_at.append(time.monotonic() - t0)
            lines.append(line)

    readers = [threading.Thread(target=pump, args=(p.stdout, out, False), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, err, True), daemon=True)]
    for r in readers:
        r.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        for r in readers:
            r.join(5)
        pytest.fail(f"mpiexec did not finish within {timeout} s (a hang): {cmd}\nstdout:\n{''.join(out)}\n"
                    f"stderr:\n{''.join(err)}")
    secs = time.monotonic() - t0
    for r in readers:
        r.join(HANG_GUARD)  # a rank that outlived mpiexec still holds the pipes: its output is cut there
    return Run(p.returncode, "".join(out), "".join(err), secs, fault_at[0] if fault_at else None)
