"""caffe: BVLC Caffe rebuilt in Python (pycaffe's surface).

`caffe` is shared by several distributions (caffe-proto, caffe-blob,
caffe-layers, caffe-net, caffe-solver, caffe-parallel, caffe-cli); this file,
owned by caffe-blob, extends the package path over all of them and exposes
pycaffe's top-level names lazily, from whichever packages are installed. A name
from a package that is not installed raises AttributeError naming the package.
"""
import os as _os
from pkgutil import extend_path

# Thread pools share few cores: the Cython kernels' OpenMP threads and OpenBLAS's GEMM threads. Threads
# that spin-wait after their work starve the other pool (LeNet ran 30x slower on 2 cores). Both settings
# are read when the libraries load, so they are made here, first, unless the user chose otherwise.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__path__ = extend_path(__path__, __name__)

# Test support: CAFFE_CUPY_STANDIN=1 replaces CuPy by a NumPy stand-in (no GPU) before anything imports it,
# in this process and in every rank it spawns (caffe.blob._standin; scripts/test.sh's GPU run).
if _os.environ.get("CAFFE_CUPY_STANDIN"):
    from caffe.blob._standin import install_from_env as _standin
    _standin()

from caffe.blob import Blob  # noqa: E402
from caffe.blob.context import (  # noqa: E402
    set_mode_cpu, set_mode_gpu, set_device, set_random_seed, set_solver_count, solver_count,
    set_solver_rank, solver_rank, set_multiprocess, multiprocess, root_solver, device_query,
)

TRAIN = 0
TEST = 1

# pycaffe name -> (module that defines it, distribution that ships it)
_LAZY = {
    "Layer": ("caffe.layers", "caffe-layers"),
    "layer_type_list": ("caffe.layers", "caffe-layers"),
    "Net": ("caffe.net", "caffe-net"),
    "Classifier": ("caffe.net", "caffe-net"),
    "io": ("caffe.net.io", "caffe-net"),
    "get_solver": ("caffe.solver", "caffe-solver"),
    "Solver": ("caffe.solver", "caffe-solver"),
    "SGDSolver": ("caffe.solver", "caffe-solver"),
    "NesterovSolver": ("caffe.solver", "caffe-solver"),
    "AdaGradSolver": ("caffe.solver", "caffe-solver"),
    "RMSPropSolver": ("caffe.solver", "caffe-solver"),
    "AdaDeltaSolver": ("caffe.solver", "caffe-solver"),
    "AdamSolver": ("caffe.solver", "caffe-solver"),
    "NCCL": ("caffe.parallel", "caffe-parallel"),
    "has_nccl": ("caffe.parallel", "caffe-parallel"),
}


def __getattr__(name):
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module 'caffe' has no attribute {name!r}")
    module_name, dist = entry
    import importlib
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise AttributeError(f"caffe.{name} needs the {dist} package: pip install {dist}") from None
        raise
    value = module if name == "io" and module_name.endswith(".io") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
