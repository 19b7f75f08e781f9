#!/usr/bin/env bash
# Run every test of the monorepo on a fresh machine: Python 3.11 and pip are enough.
# Installs what it needs into .venv (scripts/install.sh), then runs pytest; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh
python -m pytest "$@"
