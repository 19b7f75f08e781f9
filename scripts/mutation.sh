#!/usr/bin/env bash
# Mutation testing of one package, or of some of its modules, with mutmut 3: every small change mutmut
# makes to the code (a < for a <=, a 0 for a 1, a dropped call, ...) should make some test fail; the
# mutants that survive point at behaviour no test checks. Not part of CI (slow); see docs/MUTATION.md.
#
#   bash scripts/mutation.sh PACKAGE [MODULE ...]
#
#   PACKAGE  a folder under packages/: blob, layers, net, solver, parallel, cli
#   MODULE   modules to mutate, as paths under packages/PACKAGE/src (globs allowed), e.g.
#            caffe/layers/crop.py 'caffe/solver/*_solver.py'; default: every module of the package
#
# Environment:
#   MUTATION_TESTS   test files or folders (relative to packages/PACKAGE) run against the mutants; default:
#                    tests (the whole package suite). mutmut first records which tests reach which function,
#                    then runs only those for each mutant.
#   MUTATION_JOBS    mutants tested at once (default: the number of CPUs)
#   MUTATION_DIR     work folder (default: .mutation/PACKAGE, git-ignored); starts afresh unless
#                    MUTATION_RESUME=1 (then an interrupted run continues where it stopped)
#   MUTATION_ONLY    run only these mutants (mutmut names or globs, space-separated), or "device": only the
#                    device-only mutants of the MODULEs (scripts/mutation_device.py: lines under `if xp is not
#                    np`, the dispatch lines, kernel-wrapper calls, `*_device` functions, and the functions
#                    named in MUTATION_WHOLE), for a stand-in run; the others stay "not checked"
#   MUTATION_RETEST=1  run only the previous run's survivors again, against the package's current tests
#                    (after adding tests that should kill them); the MODULE arguments are then ignored (the
#                    run's own module list, in the work folder's pyproject.toml, is kept)
#
# The device path: CAFFE_CUPY_STANDIN=1 MUTATION_TESTS="tests -m gpu" runs the gpu-marked tests under the
# CuPy stand-in, as CI's second run. Both reach mutmut's test runs (checked: the record of which tests reach
# which function lists gpu-marked tests only, reaching conv_device/pool_device): mutmut runs pytest inside
# its own (forked) processes, which inherit the environment, so CAFFE_CUPY_STANDIN installs the stand-in
# at `import caffe`; pytest options in MUTATION_TESTS (-m, -k, --ignore) select the tests it traces, and
# each mutant then runs the traced tests that reach its function, by node id.
#
# The tests run as CI runs them (CI=true: the derandomized hypothesis draws, in the "mutation" profile: the
# ci profile's examples without shrinking, so a killed mutant's failing test stops at once) with pytest's importlib
# import mode, from a copy of the package's src and tests in the work folder, where mutmut puts the
# mutated modules ahead of the editable install on sys.path. Test helpers (testing.py, strategies.py) are
# not mutated. Prints the score and every survivor's diff; the same goes to MUTATION_DIR/report.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
pkg=$1
shift
src="packages/$pkg/src"
[ -d "$src" ] || { echo "mutation.sh: no package '$pkg' (expected $src)" >&2; exit 2; }
for m in "$@"; do
    compgen -G "$src/$m" > /dev/null || { echo "mutation.sh: no module '$m' under $src" >&2; exit 2; }
done
tests=${MUTATION_TESTS:-tests}
jobs=${MUTATION_JOBS:-$(nproc)}
work=${MUTATION_DIR:-$repo/.mutation/$pkg}
case $work in /*) ;; *) work=$repo/$work ;; esac  # the checks below run from other folders

[ -x .venv/bin/python ] || bash scripts/install.sh
py=$repo/.venv/bin/python
"$py" -c "import mutmut" 2>/dev/null || "$py" -m pip install -q "mutmut>=3.8,<4"

retest=()
if [ "${MUTATION_RETEST:-0}" = 1 ]; then
    # after adding tests: run the previous run's survivors again, against the package's current tests
    [ -d "$work/mutants" ] || { echo "mutation.sh: no previous run in $work to retest" >&2; exit 2; }
    mapfile -t retest < <(cd "$work" && "$repo/.venv/bin/mutmut" results 2>/dev/null |
                          sed -n 's/^ *\([^ :]*\): \(survived\|no tests\)$/\1/p')
    echo "mutation.sh: retesting ${#retest[@]} survivors of the previous run"
    # the current sources too (mtimes kept): mutmut copies the changed unmutated modules the new tests may
    # need; a mutated module that changed gets new mutants, so its old survivors' names may no longer match
    changed=$(cd "$src" && for f in $(find . -name '*.py' | sed 's|^\./||'); do
                  cmp -s "$f" "$work/src/$f" || echo "$f"; done || true)
    [ -z "$changed" ] || echo "mutation.sh: changed since the run (in a mutated module, a changed function's" \
                              "mutants are made anew: old survivor names may name other mutants, and its" \
                              "other mutants are left unchecked):" $changed
    # and which tests reach which function recorded afresh: mutmut re-traces only tests with new names, so
    # a test changed since the run would not be run against the mutants it now reaches
    rm -rf "$work/src" "$work/tests" "$work/mutants/tests" "$work/mutants/mutmut-stats.json"
    # mutmut copies a source file into mutants/ only when it is not there yet (.py modules are refreshed
    # when mutants are made, the rest is not): drop the rest (compiled kernels, .pxi), so the current build
    # is copied, not the one of the run (kernels older than the tests fail the clean run)
    find "$work/mutants/src" -type f ! -name '*.py' ! -name '*.py.meta' ! -name '*.py.spans' -delete
    cp -a "$src" "$work/src"
    cp -a "packages/$pkg/tests" "$work/tests"
else
    if [ "${MUTATION_RESUME:-0}" != 1 ]; then
        rm -rf "$work"
    fi
    mkdir -p "$work"
    # the package's sources (with its compiled kernels) and tests; mtimes kept, so a resumed run sees what changed
    rm -rf "$work/src" "$work/tests"
    cp -a "$src" "$work/src"
    cp -a "packages/$pkg/tests" "$work/tests"
fi
find "$work/src" "$work/tests" \( -name __pycache__ -o -name .hypothesis \) -prune -exec rm -rf {} +

"$py" - "$work" "$tests" "$@" <<'PY'
import json, os, sys, tomllib
work, tests, modules = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
only = [f"src/{m}" for m in modules]
if os.environ.get("MUTATION_RETEST") == "1" and os.path.exists(f"{work}/pyproject.toml"):
    # a retest mutates what the run mutated: an empty only_mutate would mutate every module of the package
    # (each changed source, by mtime, regenerated: minutes of generation and trampolines in every module)
    only = tomllib.load(open(f"{work}/pyproject.toml", "rb"))["tool"]["mutmut"].get("only_mutate", [])
    if not only:  # written empty by a retest before this rule: the modules with results are the run's
        import glob
        for meta in sorted(glob.glob(f"{work}/mutants/src/**/*.py.meta", recursive=True)):
            if any(v is not None for v in json.load(open(meta)).get("exit_code_by_key", {}).values()):
                only.append(meta[len(f"{work}/mutants/"):-len(".meta")])
lines = [
    "[tool.mutmut]",
    'source_paths = ["src"]',
    f"only_mutate = {json.dumps(only)}",
    'do_not_mutate = ["*/testing.py", "*/strategies.py"]',
    # as the repository's pytest.ini: importlib import mode (test files share names across packages)
    'pytest_add_cli_args = ["--import-mode=importlib", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]',
    f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
    # each mutant forked from a server that has only collected the tests, not from mutmut's main process
    # (the default, "fork"), which has run the whole suite for its stats and clean run: there the caches
    # the unmutated code filled (caffe.layers.device.cached's index arrays and divisors, compiled
    # kernels, scratch buffers) were inherited, so a mutant in a cached builder was never built and survived
    'process_isolation = "forkserver"',
    # the machine is shared: a slow clean run must not turn into timeouts
    "timeout_multiplier = 15.0",
    "timeout_constant = 10.0",
]
open(f"{work}/pyproject.toml", "w").write("\n".join(lines) + "\n")
PY

cd "$work"
only=()
if [ "${MUTATION_ONLY:-}" = device ]; then
    whole=()
    for f in ${MUTATION_WHOLE:-}; do whole+=(--whole "$f"); done
    mapfile -t only < <("$py" "$repo/scripts/mutation_device.py" --generate "${whole[@]}" "$@" | grep __mutmut_)
    echo "mutation.sh: ${#only[@]} device-only mutants selected"
    [ ${#only[@]} -gt 0 ] || exit 2
elif [ -n "${MUTATION_ONLY:-}" ]; then
    read -r -a only <<< "$MUTATION_ONLY"
fi
echo "mutation.sh: mutating packages/$pkg/src/${*:-*} against $tests (jobs: $jobs, work folder: $work)"
start=$(date +%s)
CI=true OMP_NUM_THREADS=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-mutation} "$repo/.venv/bin/mutmut" run --max-children "$jobs" "${retest[@]}" "${only[@]}" > run.log 2>&1 || {
    tail -40 run.log >&2
    echo "mutation.sh: mutmut run failed (log: $work/run.log)" >&2
    exit 1
}
"$repo/.venv/bin/mutmut" export-cicd-stats > /dev/null
"$py" "$repo/scripts/mutation_report.py" "$pkg" "$(( $(date +%s) - start ))" "$repo/.venv/bin/mutmut" | tee report.txt
