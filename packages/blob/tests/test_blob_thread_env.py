"""`import caffe` sets the thread pools' environment (caffe/__init__.py) unless the user chose: libgomp's threads
spin GOMP_SPINCOUNT=3000 PAUSEs before sleeping (OMP_WAIT_POLICY=PASSIVE otherwise), OpenBLAS's sleep at once;
caffe.thread_env_set names exactly what it set (benchmarks drop those names for another framework's process).

Each case runs in a fresh interpreter: the settings are made once, at the first import."""
import json
import os
import subprocess
import sys

import pytest

NAMES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")
PROBE = r"""
import json, os
import caffe
print(json.dumps({"env": {n: os.environ.get(n) for n in %r}, "set": list(caffe.thread_env_set)}))
""" % (NAMES,)


def _run(user_env):
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(user_env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user_env, expect_env, expect_set", [
    ({}, {"GOMP_SPINCOUNT": "3000", "OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}, NAMES),
    # the user's wait policy stands, with libgomp's own spin count for it
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "ACTIVE",
                                     "OPENBLAS_THREAD_TIMEOUT": "4"}, ("OPENBLAS_THREAD_TIMEOUT",)),
    # the user's spin count stands; the policy is still made passive (the count overrides it in libgomp)
    ({"GOMP_SPINCOUNT": "0"}, {"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"},
     ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")),
    ({"OPENBLAS_THREAD_TIMEOUT": "10"}, {"GOMP_SPINCOUNT": "3000", "OMP_WAIT_POLICY": "PASSIVE",
                                         "OPENBLAS_THREAD_TIMEOUT": "10"}, ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")),
])
def test_thread_env_defaults_and_the_users_choice(user_env, expect_env, expect_set):
    res = _run(user_env)
    assert res["env"] == expect_env
    assert tuple(res["set"]) == expect_set
