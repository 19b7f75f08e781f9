#!/usr/bin/env bash
# Install every package of the monorepo into .venv (created if missing), editable, with the
# build and test tools. Sourced by scripts/test.sh and scripts/main_job.sh; needs only Python 3.11+ and pip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt
pkgs=(-e proto)
for p in blob layers net solver parallel cli onnx; do
  [ -f "packages/$p/pyproject.toml" ] && pkgs+=(-e "packages/$p[test]")
done
# editable installs compile the Cython extensions in place, so nothing runs against a stale build
python -m pip install -q --no-build-isolation "${pkgs[@]}"
