"""The device-only mutants of a mutmut 3 work folder (scripts/mutation.sh with MUTATION_ONLY=device).

A stand-in run (CAFFE_CUPY_STANDIN=1, gpu-marked tests) compares GPU mode with CPU mode; a mutant of code
both modes run moves both sides alike, so only mutants of device-only code are worth its time (the shared
code's belong to the plain runs). A mutant is device-only when every line it changes is
  - in the body of an `if` whose test is `xp is not np` or an `and` holding it (or the else of
    `if xp is np:`, or what follows such a block that returns), or
  - a line that itself names `xp is np` / `xp is not np` (the dispatch) or calls a hand-written kernel's
    wrapper (`cuda_norm.`, `cuda_pooling.`, ...: a real GPU's; the stand-in runs none, the `[host]` tests
    of test_layers_device_kernels.py do), or
  - in a function named `*_device`, or in one named on the command line (--whole NAME: a function only the
    device reaches in the stand-in's parity tests, e.g. a builder the CPU's compiled kernel never calls).
The selection is by lines, so a line naming `xp is np` also brings the host's other conditions on it (e.g.
`_fast`'s `_k is not None`): read such survivors as CPU-side.

usage (from the work folder, after the mutants are made):
  python scripts/mutation_device.py [--generate] [--whole FUNC ...] MODULE.py ...   # prints mutant names
"""
from __future__ import annotations

import ast
import difflib
import sys
from pathlib import Path

DISPATCH = ("xp is not np", "xp is np")
KERNEL_CALL = "cuda_"  # a hand-written kernel's wrapper (kernels/cuda_*.py): a real GPU only


def _generate() -> None:
    """Make the mutants (mutmut's first step) without running a test."""
    from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths
    from mutmut.mutation.trampoline import set_mutant_under_test
    set_mutant_under_test("mutant_generation")
    out, sys.stdout = sys.stdout, sys.stderr  # mutmut prints each file it copies
    try:
        Path("mutants").mkdir(exist_ok=True)
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        create_mutants(1)
    finally:
        sys.stdout = out


def _is_xp_np(node: ast.AST, op: type) -> bool:
    """node is `xp is np` (op ast.Is) or `xp is not np` (ast.IsNot)."""
    return (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "xp"
            and len(node.ops) == 1 and isinstance(node.ops[0], op)
            and isinstance(node.comparators[0], ast.Name) and node.comparators[0].id == "np")


def _device_lines(func: ast.AST, lines: list[str]) -> set[int]:
    """Line numbers (in the file) of func's device-only code."""
    out: set[int] = set()

    def span(stmts):
        for s in stmts:
            out.update(range(s.lineno, s.end_lineno + 1))

    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        t = node.test
        if _is_xp_np(t, ast.IsNot) or (isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And)
                                       and any(_is_xp_np(v, ast.IsNot) for v in t.values)):
            span(node.body)  # runs only on the device (with a further condition, maybe)
        elif _is_xp_np(t, ast.Is):
            span(node.orelse)
            if not node.orelse and node.body and isinstance(node.body[-1], ast.Return):
                # `if xp is np: ...; return` then the device's code
                body = next(b for b in _bodies(func) if node in b)
                span(body[body.index(node) + 1:])
    for n in range(func.lineno, func.end_lineno + 1):
        if any(d in lines[n - 1] for d in DISPATCH) or (KERNEL_CALL in lines[n - 1]
                                                         and "import" not in lines[n - 1]):
            out.add(n)
    return out


def _bodies(func: ast.AST):
    for node in ast.walk(func):
        for field in ("body", "orelse", "finalbody"):
            b = getattr(node, field, None)
            if isinstance(b, list):
                yield b


def select(path: Path, whole: set[str]) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    module = ".".join(path.with_suffix("").parts[path.parts.index("src") + 1:])
    chosen = []
    for name, mutant in funcs.items():
        base, sep, num = name.rpartition("__mutmut_")
        if not sep or num == "orig" or not num.isdigit():
            continue
        orig = funcs.get(base + "__mutmut_orig")
        if orig is None:
            continue
        plain = base.split("ǁ")[-1] if "ǁ" in base else base[2:]  # x_name / xǁClassǁname
        a = lines[orig.lineno - 1:orig.end_lineno]
        b = lines[mutant.lineno - 1:mutant.end_lineno]
        b[0] = b[0].replace(mutant.name, orig.name, 1)
        changed = set()
        for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag != "equal":
                changed.update(range(orig.lineno + i1, orig.lineno + max(i2, i1 + 1)))
        if not changed:
            continue
        if plain in whole or plain.endswith("_device") or changed <= _device_lines(orig, lines):
            chosen.append(f"{module}.{name}")
    return chosen


def main(argv: list[str]) -> None:
    whole, files, generate = set(), [], False
    it = iter(argv)
    for arg in it:
        if arg == "--whole":
            whole.add(next(it))
        elif arg == "--generate":
            generate = True
        else:
            files.append(arg)
    if generate:
        _generate()
    for f in files:
        for name in select(Path("mutants/src") / f, whole):
            print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
