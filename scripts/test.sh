#!/usr/bin/env bash
# Run every test of the monorepo on a fresh machine: Python 3.11 and pip are enough.
# Installs what it needs into .venv (scripts/install.sh), then runs pytest twice (extra arguments go to both):
#   1. the whole suite; gpu-marked tests run on a real GPU if one is usable, else they skip;
#   2. without a usable GPU: the gpu-marked tests (device paths, CPU/GPU parity properties, NCCL ranks) again,
#      under the CuPy stand-in (CAFFE_CUPY_STANDIN=1: NumPy on the host behind CuPy's API; NO GPU RUNS).
#      CAFFE_TEST_STANDIN=0 leaves this run out.
# The exit status is the first run's failure, else the second's.
set -uo pipefail
cd "$(dirname "$0")/.."
unset CAFFE_CUPY_STANDIN  # the first run is the plain one; the stand-in run below sets it
set -e
source scripts/install.sh
set +e
python -m pytest "$@"
status=$?
if python -c "from caffe.blob import context; raise SystemExit(0 if context.gpu_available() else 1)" 2>/dev/null; then
  echo "== a real GPU is usable: the gpu-marked tests ran on it above; no stand-in run"
elif [ "${CAFFE_TEST_STANDIN:-1}" = "0" ]; then
  echo "== CAFFE_TEST_STANDIN=0: the gpu-marked tests were not run under the CuPy stand-in"
else
  echo
  echo "== gpu-marked tests under the CuPy STAND-IN (NumPy on the host, CAFFE_CUPY_STANDIN=1): NO GPU RUNS =="
  CAFFE_CUPY_STANDIN=1 python -m pytest "$@"
  second=$?
  [ "$second" -eq 5 ] && second=0  # the arguments selected no gpu-marked test
  echo "== end of the CuPy stand-in run (exit status $second): device plumbing checked, no GPU numerics =="
  [ "$status" -eq 0 ] && status=$second
fi
exit "$status"
