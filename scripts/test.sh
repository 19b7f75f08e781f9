#!/usr/bin/env bash
# Run every test of the monorepo on a fresh machine: Python 3.11 and pip are enough.
# Creates .venv (if missing), installs the build/test tools and every package (editable,
# which compiles the Cython extensions, so tests never run against a stale build), then
# runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt
pkgs=(-e proto)
for p in blob layers net solver parallel cli; do
  [ -f "packages/$p/pyproject.toml" ] && pkgs+=(-e "packages/$p[test]")
done
python -m pip install -q --no-build-isolation "${pkgs[@]}"
python -m pytest "$@"
