"""Every package's GPU extras ask for the same CuPy (NCCL's bindings need CuPy >= 14: one minimum for all)."""
import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every package that runs on the GPU offers both extras; a package found with either must follow the same rule
GPU_PACKAGES = ["blob", "layers", "net", "solver", "parallel", "cli"]
PACKAGES = sorted(set(GPU_PACKAGES) | {p.parent.name for p in Path(ROOT, "packages").glob("*/pyproject.toml")
                                       if "cuda1" in p.read_text()})
CUPY_MIN = "14"


def extras(pkg):
    with open(os.path.join(ROOT, "packages", pkg, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"].get("optional-dependencies", {})


def cupy_requirements(pkg, extra, seen=()):
    """The cupy-cuda* requirements an extra pulls in, following caffe-X[extra] references."""
    out = []
    for req in extras(pkg).get(extra, []):
        m = re.match(r"caffe-(\w+)\[([\w-]+)\]", req)
        if m:
            assert (m[1], m[2]) not in seen, f"{pkg}[{extra}]: extras refer to each other in a cycle"
            out += cupy_requirements(m[1], m[2], seen + ((pkg, extra),))
        elif req.startswith("cupy"):
            out.append(req)
    return out


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("extra,wheel", [("cuda12", "cupy-cuda12x"), ("cuda13", "cupy-cuda13x")])
def test_cuda_extras_pull_one_cupy_minimum(pkg, extra, wheel):
    reqs = cupy_requirements(pkg, extra)
    assert reqs == [f"{wheel}>={CUPY_MIN}"], f"caffe-{pkg}[{extra}] pulls {reqs}"


def test_nccl_extras_use_the_same_cupy_minimum():
    for extra, wheel in (("nccl", "cupy-cuda12x"), ("nccl-cuda12", "cupy-cuda12x"), ("nccl-cuda13", "cupy-cuda13x")):
        assert cupy_requirements("parallel", extra) == [f"{wheel}>={CUPY_MIN}"], extra
