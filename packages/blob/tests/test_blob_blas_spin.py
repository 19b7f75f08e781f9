"""`import numpy` before `import caffe`: OpenBLAS still takes caffe's short thread timeout (caffe.blob.blas_spin).

Each case runs in a fresh interpreter: this one imported caffe long ago, and OpenBLAS reads its environment
once. What is checked is the value OpenBLAS itself reports (`openblas_thread_timeout`), not a timing."""
import os
import subprocess
import sys

import pytest

FIRST = r"""
import ctypes, json, sys
import numpy
libs = [line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if len(line.split(None, 5)) == 6]
libs = sorted({p for p in libs if "openblas" in p.rsplit("/", 1)[-1].lower() and ".so" in p})
found = [ctypes.CDLL(p) for p in libs]
found = [lib for lib in found if hasattr(lib, "openblas_thread_timeout") and hasattr(lib, "openblas_read_env")
         and hasattr(lib, "blas_thread_shutdown_")]
before = [lib.openblas_thread_timeout() for lib in found]
import caffe  # noqa: E402
after = [lib.openblas_thread_timeout() for lib in found]
numpy.ones((300, 300)) @ numpy.ones((300, 300))  # the threads start again and work
print(json.dumps({"before": before, "after": after}))
"""


def _run(extra_env):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", FIRST], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    import json
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["before"]:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS that exports openblas_read_env / blas_thread_shutdown_")
    return res


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the loaded OpenBLAS in /proc/self/maps")
def test_numpy_imported_first_still_gets_the_short_thread_timeout():
    res = _run({})
    assert res["before"] == [0] * len(res["before"])  # OpenBLAS loaded with its default (the slow case)
    assert res["after"] == [4] * len(res["after"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the loaded OpenBLAS in /proc/self/maps")
def test_a_thread_timeout_the_user_set_is_left_alone():
    res = _run({"OPENBLAS_THREAD_TIMEOUT": "9"})
    assert res["before"] == res["after"] == [9] * len(res["before"])
