"""OpenBLAS's idle threads, when NumPy was imported before caffe.

Two thread pools share the cores: the Cython kernels' OpenMP threads and OpenBLAS's GEMM threads. An
OpenBLAS thread that has finished its share spins for 2^THREAD_TIMEOUT cycles (by default 2^28, about a
tenth of a second) before it sleeps, and takes a core from the kernels that run next. caffe/__init__.py
sets OPENBLAS_THREAD_TIMEOUT=4 before anything loads OpenBLAS; but OpenBLAS reads its environment once,
when NumPy loads it, and a script that starts `import numpy as np; import caffe` (most do) loaded it
first: CIFAR10-quick's fwd+bwd measured 118-135 ms instead of 89-97 ms (bench/README.md).

OpenBLAS exports what it needs to take the value afterwards: `openblas_read_env` reads the environment
again, and `blas_thread_shutdown_` (also its fork handler) stops the threads; the next parallel call
starts them again with the timeout just read. This does that for every OpenBLAS the process has loaded.
"""
from __future__ import annotations

import ctypes
import os


def loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps]
    except OSError:
        return []
    paths = {f[5].strip() for f in fields if len(f) == 6}
    return sorted(p for p in paths if "openblas" in os.path.basename(p).lower() and ".so" in p)


def _openblas_handles():
    """(path, library) for each loaded OpenBLAS that exports what this module calls."""
    for path in loaded_openblas():
        lib = ctypes.CDLL(path)
        if all(hasattr(lib, f) for f in ("openblas_thread_timeout", "openblas_read_env", "blas_thread_shutdown_")):
            lib.openblas_thread_timeout.restype = ctypes.c_int
            yield path, lib


def thread_timeouts() -> dict[str, int]:
    """The thread timeout each loaded OpenBLAS has read from the environment (0: unset, its default)."""
    return {path: lib.openblas_thread_timeout() for path, lib in _openblas_handles()}


def reread_thread_timeout() -> list[str]:
    """Make every loaded OpenBLAS take OPENBLAS_THREAD_TIMEOUT from the environment now; returns the
    libraries done (those that export the entry points; others are left as they are)."""
    done = []
    for path, lib in _openblas_handles():
        lib.openblas_read_env()
        lib.blas_thread_shutdown_()
        done.append(path)
    return done
