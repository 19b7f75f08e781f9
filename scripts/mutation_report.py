"""Summarize a mutmut 3 run (called by scripts/mutation.sh from its work folder): the score and each
surviving mutant, sorted into what it changed, so the ones worth a test stand out:

  behaviour  code that computes something (a value, a condition, a call, a shape)
  message    only the text of an error being raised (the project asks for clear errors: worth a `match=`
             where the text names what is at fault; cosmetic where it only rewords)
  log        only a logging call's text or arguments (cosmetic: the log format has its own tests where it
             matters, e.g. Caffe's glog lines)

usage: python scripts/mutation_report.py PACKAGE SECONDS MUTMUT [--names-only]
"""
from __future__ import annotations

import ast
import difflib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

LOGGERS = {"log", "logger", "logging", "_log", "warnings"}
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical"}


def _function(tree: ast.AST, name: str) -> ast.AST | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _first_difference(orig: ast.AST, mutant: ast.AST) -> ast.AST | None:
    """The first node (breadth first) of the mutant's function that differs from the original's."""
    for a, b in zip(ast.walk(orig), ast.walk(mutant)):
        if type(a) is not type(b):
            return b
        fields_a = {k: v for k, v in ast.iter_fields(a) if not isinstance(v, (ast.AST, list))}
        fields_b = {k: v for k, v in ast.iter_fields(b) if not isinstance(v, (ast.AST, list))}
        fields_a.pop("name", None)  # the function's own name differs by construction
        fields_b.pop("name", None)
        if fields_a != fields_b or len(list(ast.iter_child_nodes(a))) != len(list(ast.iter_child_nodes(b))):
            return b
    return None


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        base = f.value
        base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        return base_name in LOGGERS or (f.attr in LOG_METHODS and "log" in base_name.lower())
    return isinstance(f, ast.Name) and f.id in ("print", "warn")


def _is_error_call(node: ast.AST) -> bool:
    """An exception being built, or a layer's error()/check() helper."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name.endswith(("Error", "Exception", "Warning")) or name in ("error", "check", "warn")


def _is_text(node: ast.AST) -> bool:
    return (isinstance(node, (ast.JoinedStr, ast.FormattedValue))
            or (isinstance(node, ast.Constant) and (isinstance(node.value, str) or node.value is None)))


class Module:
    """A mutated module as mutmut wrote it (every variant of every function), parsed once."""

    def __init__(self, path: Path):
        self.source = path.read_text()
        self.tree = ast.parse(self.source)
        self.functions = {node.name: node for node in ast.walk(self.tree)
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}

        self.lines = self.source.splitlines()

    def text(self, node: ast.AST) -> str:
        return textwrap.dedent("\n".join(self.lines[node.lineno - 1:node.end_lineno]))


_modules: dict[str, Module | None] = {}


def _module(src_root: Path, module: str) -> Module | None:
    if module not in _modules:
        path = src_root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = src_root / module.replace(".", "/") / "__init__.py"
        try:
            _modules[module] = Module(path)
        except (OSError, SyntaxError):
            _modules[module] = None
    return _modules[module]


def classify(src_root: Path, mutant_name: str) -> tuple[str, str]:
    """(kind, diff) of one mutant against its original function."""
    module, _, func = mutant_name.rpartition(".")
    mod = _module(src_root, module)
    base = func.rsplit("__mutmut_", 1)[0]
    orig = mod.functions.get(base + "__mutmut_orig") if mod else None
    mutant = mod.functions.get(func) if mod else None
    if orig is None or mutant is None:
        return "behaviour", ""
    a, b = mod.text(orig).splitlines(), mod.text(mutant).splitlines()
    b[0] = b[0].replace(mutant.name, orig.name, 1)  # the variant's name is no change (its defaults may be)
    diff = "\n".join(difflib.unified_diff(a, b, "original", mutant_name, lineterm="", n=2))
    node = _first_difference(orig, mutant)
    if node is None:
        return "behaviour", diff
    parents = _parents(mutant)
    chain, cur = [node], node
    while cur in parents:
        cur = parents[cur]
        chain.append(cur)
    if any(_is_log_call(n) for n in chain):
        return "log", diff
    # a change confined to string literals (or a string replaced by None) of an error being raised
    text_only = _is_text(node) or (isinstance(node, ast.keyword) and _is_text(node.value))
    if text_only and any(isinstance(n, ast.Raise) or _is_error_call(n) for n in chain):
        return "message", diff
    return "behaviour", diff


def main() -> None:
    pkg, secs, mutmut = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    names_only = "--names-only" in sys.argv
    s = json.load(open("mutants/mutmut-cicd-stats.json"))
    killed, survived, no_tests = s.get("killed", 0), s.get("survived", 0), s.get("no_tests", 0)
    timeout, suspicious = s.get("timeout", 0), s.get("suspicious", 0)
    tested = killed + survived + no_tests + timeout + suspicious
    print(f"caffe-{pkg}: {s.get('total', tested)} mutants in {secs} s: killed {killed}, timeout {timeout} (counts "
          f"as killed), survived {survived}, no tests {no_tests}, suspicious {suspicious}, skipped "
          f"{s.get('skipped', 0)}")
    results = subprocess.run([mutmut, "results"], capture_output=True, text=True).stdout.splitlines()
    open_ = []
    for line in results:
        name, _, status = line.strip().rpartition(": ")
        if status in ("survived", "no tests", "suspicious"):
            open_.append((name.strip(), status))
    classified = {name: classify(Path("mutants/src"), name) for name, _ in open_}
    kinds = {name: kind for name, (kind, _) in classified.items()}
    count = {k: sum(1 for v in kinds.values() if v == k) for k in ("behaviour", "message", "log")}
    if tested:
        print(f"score: {100 * (killed + timeout) / tested:.1f}% of {tested} (killed + timeout over all tested); "
              f"{100 * (killed + timeout) / max(1, tested - count['log']):.1f}% without the {count['log']} "
              f"log-only survivors")
    print(f"not killed: {count['behaviour']} behaviour, {count['message']} message, {count['log']} log")
    by_function: dict[str, int] = {}
    for name in kinds:
        key = f"{kinds[name]:9} {name.rsplit('__mutmut_', 1)[0]}"
        by_function[key] = by_function.get(key, 0) + 1
    print("\nnot killed, by function:")
    for key, n in sorted(by_function.items()):
        print(f"  {n:4}  {key}")
    for kind in ("behaviour", "message", "log"):
        for name, status in open_:
            if kinds[name] != kind:
                continue
            print(f"\n=== [{kind}] {name} ({status})")
            if not names_only and kind != "log":
                print(classified[name][1])


if __name__ == "__main__":
    main()
