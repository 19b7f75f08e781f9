#!/usr/bin/env bash
# "Install only the packages you need": for each package, a fresh venv gets that package and the ones
# below it (plain, non-editable pip installs from local paths, with its `test` extra), then runs that
# package's tests alone. Usage: bash scripts/check_isolation.sh [pkg ...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
order=(blob layers net solver parallel cli)
# packages beside the main line, and what each stands on
declare -A below=([onnx]="blob layers net")
if [ $# -eq 0 ]; then want=("${order[@]}" "${!below[@]}"); else want=("$@"); fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for pkg in "${want[@]}"; do
  chain=("$ROOT/proto")
  if [ -n "${below[$pkg]:-}" ]; then
    for p in ${below[$pkg]}; do chain+=("$ROOT/packages/$p"); done
    chain+=("$ROOT/packages/$pkg[test]")
  else
    for p in "${order[@]}"; do
      if [ "$p" = "$pkg" ]; then chain+=("$ROOT/packages/$p[test]"); break; fi
      chain+=("$ROOT/packages/$p")
    done
  fi
  venv="$work/$pkg"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  echo "== caffe-$pkg: pip install ${chain[*]##*/}"
  if ! "$venv/bin/python" -m pip install -q "${chain[@]}" > "$work/$pkg.log" 2>&1; then
    echo "   install FAILED"; tail -20 "$work/$pkg.log"; status=1; continue
  fi
  # run from an empty directory so only the installed packages (not the source tree) are imported
  if (cd "$work" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$work" \
        -c /dev/null "$ROOT/packages/$pkg/tests" 2>&1 | tail -2); then :; else status=1; fi
done
exit $status
