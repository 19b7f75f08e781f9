"""`import numpy` before `import caffe`: OpenBLAS still takes caffe's short thread timeout (caffe.blob.blas_spin).

Each case runs in a fresh interpreter: this one imported caffe long ago, and OpenBLAS reads its environment
once. What is checked is the value OpenBLAS itself reports (`openblas_thread_timeout`), not a timing."""
import json
import os
import subprocess
import sys

import pytest

from caffe.blob import blas_spin

# blas_spin.py is loaded from its file, so that `import caffe` (the fix under test) runs only where the script
# says; it imports nothing but ctypes and os.
FIRST = r"""
import importlib.util, json, sys
import numpy
spec = importlib.util.spec_from_file_location("blas_spin_probe", sys.argv[1])
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
before = list(probe.thread_timeouts().values())
import caffe  # noqa: E402
after = list(probe.thread_timeouts().values())
numpy.ones((300, 300)) @ numpy.ones((300, 300))  # the threads start again and work
print(json.dumps({"before": before, "after": after}))
"""


def _run(extra_env):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", FIRST, blas_spin.__file__], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
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
