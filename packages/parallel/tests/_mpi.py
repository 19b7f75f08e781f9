"""Helpers for the tests that run ranks under mpiexec (imported by path; not a test module)."""
import importlib.util
import os
import shutil
import subprocess
import sys
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


def run_mpi(n, args, timeout=60, mpi_flags=(), env=None):
    """Run `python args...` on n ranks; returns (returncode, stdout, stderr, seconds)."""
    exe = require_mpiexec()
    full_env = dict(os.environ)
    full_env.pop("CAFFE_PARALLEL_TIMEOUT", None)
    full_env.update(env or {})
    cmd = [exe, *mpi_flags, "-n", str(n), sys.executable, *map(str, args)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(HERE))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec did not finish within {timeout} s (a hang): {cmd}\nstdout:\n{exc.stdout}\n"
                    f"stderr:\n{exc.stderr}")
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
