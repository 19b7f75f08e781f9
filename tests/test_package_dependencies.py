"""Packages depend only downward: each package's code imports caffe.* only from packages below it.

A static check over every source file (imports at any depth, lazy ones included), plus a check
that each pyproject.toml declares exactly the caffe-* packages its code imports.
"""
import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["proto", "blob", "layers", "net", "solver", "parallel", "cli"]
# packages beside the main line: each stands on the packages named (and may import only those and itself)
BESIDE = {"onnx": ["proto", "blob", "layers", "net"]}
PACKAGES = ORDER + list(BESIDE)
DIST = {name: f"caffe-{name}" for name in PACKAGES}
# what each package may import (itself and everything below it); cli sits on top of all
ALLOWED = {name: set(ORDER[: i + 1]) for i, name in enumerate(ORDER)}
ALLOWED.update({name: set(deps) | {name} for name, deps in BESIDE.items()})
ALLOWED["cli"] = set(PACKAGES)
# imports a package may make only through an optional extra, never a hard dependency (cli's export_onnx)
OPTIONAL = {"cli": {"onnx"}}


def package_dir(name):
    return ROOT / "proto" if name == "proto" else ROOT / "packages" / name


def top_level_modules() -> dict:
    """pycaffe's top-level modules (caffe/net_spec.py, caffe/draw.py, ...) -> the package that ships each."""
    owners = {}
    for name in PACKAGES:
        for path in sorted((package_dir(name) / "src" / "caffe").glob("*.py")):
            if path.name != "__init__.py":
                owners.setdefault(path.stem, []).append(name)
    return owners


TOP_LEVEL = top_level_modules()


_PYX_IMPORT = re.compile(r"^\s*(?:from|c?import)\s+caffe\.(\w+)", re.M)


def caffe_imports(path: Path):
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython is not Python syntax: scan its import lines
        for m in _PYX_IMPORT.finditer(text):
            if m.group(1) in PACKAGES or m.group(1) in TOP_LEVEL:
                yield _owner(m.group(1)), text.count("\n", 0, m.start()) + 1
        return
    tree = ast.parse(text, str(path))
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods = [node.module]
            if node.module == "caffe":
                mods = [f"caffe.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                mods = [arg.value]
        for m in mods:
            parts = m.split(".")
            if parts[0] == "caffe" and len(parts) > 1 and (parts[1] in PACKAGES or parts[1] in TOP_LEVEL):
                yield _owner(parts[1]), node.lineno


def _owner(name: str) -> str:
    """The package an import of caffe.<name> lands in: a subpackage, or the shipper of a top-level module."""
    return name if name in PACKAGES else TOP_LEVEL[name][0]


def test_top_level_modules_have_one_owner():
    """Two distributions must not ship the same caffe/<module>.py, nor one named like a subpackage."""
    clashes = {m: owners for m, owners in TOP_LEVEL.items() if len(owners) > 1 or m in PACKAGES}
    assert not clashes, clashes


@pytest.mark.parametrize("name", [n for n in PACKAGES if package_dir(n).joinpath("pyproject.toml").exists()])
def test_imports_point_only_downward(name):
    src = package_dir(name) / "src"
    bad = []
    for path in sorted(src.rglob("*.py")) + sorted(src.rglob("*.pyx")):
        if path.name == "__init__.py" and path.parent == src / "caffe":
            continue  # caffe/__init__.py resolves pycaffe names lazily from whatever is installed
        for target, line in caffe_imports(path):
            if target not in ALLOWED[name]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports caffe.{target}")
    assert not bad, f"caffe-{name} must not import packages above it:\n" + "\n".join(bad)


def _names(requirements):
    return {d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for d in requirements}


@pytest.mark.parametrize("name", [n for n in PACKAGES if package_dir(n).joinpath("pyproject.toml").exists()])
def test_declared_dependencies_cover_imports(name):
    meta = tomllib.loads((package_dir(name) / "pyproject.toml").read_text())
    deps = _names(meta["project"].get("dependencies", []))
    extras = set().union(*[_names(r) for r in meta["project"].get("optional-dependencies", {}).values()])
    for optional in OPTIONAL.get(name, ()):
        assert DIST[optional] not in deps, f"caffe-{name} must not hard-depend on {DIST[optional]} (an extra only)"
        if DIST[optional] in extras:
            deps.add(DIST[optional])
    used = set()
    for path in list((package_dir(name) / "src").rglob("*.py")) + list((package_dir(name) / "src").rglob("*.pyx")):
        if path.name == "__init__.py" and path.parent.name == "caffe":
            continue
        used |= {t for t, _ in caffe_imports(path)}
    used.discard(name)
    missing = sorted(DIST[u] for u in used if DIST[u] not in deps)
    assert not missing, f"caffe-{name} imports but does not declare: {missing}"
