"""Check mutants one by one, each in isolation: what a mutation run reports as killed or survived, again.

    .venv/bin/python scripts/mutation_check.py WORK_FOLDER NAME... [-- TEST ...]
    .venv/bin/python scripts/mutation_check.py WORK_FOLDER @names.txt      (one name a line, or blank-separated)

WORK_FOLDER is a mutation.sh work folder (.mutation/<group>) after a run; NAME a mutant as `mutmut results`
names it. As mutmut's fork server does, one process collects the run's tests once; each mutant is then
switched on in a fresh fork of it and runs the tests the run recorded as reaching its function (by
duration, stopping at the first failure), or the TEST ids given after `--` (paths relative to the folder's
mutants/ copy, e.g. tests/test_layers_mutation_norm.py). Prints `NAME: killed <first failing test> <last
line of its error>`, `NAME: survived` or `NAME: no tests`.

Why: a retest run (session 7) reported mutants of code no plain test reaches (Layer.Forward's GPU branch)
as killed; switched on alone they pass every test. A run's kill is a claim until a check like this one
repeats it (docs/MUTATION.md, layers-12, session 7).
"""
import json
import os
import re
import sys
import tomllib


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    work = os.path.abspath(argv[0])
    rest = argv[1:]
    tests_given = []
    if "--" in rest:
        i = rest.index("--")
        rest, tests_given = rest[:i], rest[i + 1:]
    names = []
    for a in rest:
        names += open(a[1:]).read().split() if a.startswith("@") else [a]
    names = [n.rstrip(":") for n in names]
    os.environ.setdefault("CI", "true")  # the run's draws: the derandomized profile without shrinking
    os.environ.setdefault("HYPOTHESIS_PROFILE", "mutation")
    os.chdir(os.path.join(work, "mutants"))
    sys.path.insert(0, os.path.abspath("src"))  # the trampolined modules ahead of the editable install
    cfg = tomllib.load(open(os.path.join(work, "pyproject.toml"), "rb"))["tool"]["mutmut"]
    selection, extra = cfg["pytest_add_cli_args_test_selection"], cfg["pytest_add_cli_args"]
    stats = json.load(open("mutmut-stats.json"))
    reach, duration = stats["tests_by_mangled_function_name"], stats["duration_by_test"]

    import pytest
    devnull = os.open(os.devnull, os.O_WRONLY)
    out, err = os.dup(1), os.dup(2)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    pytest.main(["--rootdir=.", "--collect-only", "-qqq"] + selection + extra)  # imports, as the fork server
    os.dup2(out, 1)
    os.dup2(err, 2)

    for name in names:
        tests = tests_given or sorted(reach.get(re.sub(r"__mutmut_\d+$", "", name), ()),
                                      key=lambda t: duration.get(t, 0))
        if not tests:
            print(f"{name}: no tests", flush=True)
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.environ["MUTANT_UNDER_TEST"] = name
            try:
                from mutmut.mutation.trampoline import set_mutant_under_test
                set_mutant_under_test(name)
            except ImportError:  # older mutmut: the environment variable alone
                pass

            class FirstFailure:
                text = ""

                def pytest_runtest_logreport(self, report):
                    if report.failed and not FirstFailure.text:
                        last = (report.longreprtext.strip().splitlines() or [""])[-1].strip()
                        FirstFailure.text = f"{report.nodeid} {last[:160]}"

            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            rc = pytest.main(["--rootdir=.", "--tb=line", "-x", "-q", "-p", "no:randomly"] + tests + extra,
                             plugins=[FirstFailure()])
            os.write(w, f"{int(rc)}|{FirstFailure.text}".encode())
            os._exit(0)
        os.close(w)
        reply = b""
        while chunk := os.read(r, 65536):
            reply += chunk
        os.close(r)
        os.waitpid(pid, 0)
        rc, _, first = reply.decode().partition("|")
        print(f"{name}: survived" if rc == "0" else f"{name}: killed {first}" if rc == "1"
              else f"{name}: error (pytest exit {rc or 'none: the child died'}) {first}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
