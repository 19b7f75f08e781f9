"""caffe: BVLC Caffe rebuilt in Python (pycaffe's surface).

`caffe` is shared by several distributions (caffe-proto, caffe-blob,
caffe-layers, caffe-net, caffe-solver, caffe-parallel, caffe-cli); this file,
owned by caffe-blob, extends the package path over all of them and exposes
pycaffe's top-level names lazily, from whichever packages are installed. A name
from a package that is not installed raises AttributeError naming the package.

pycaffe's modules keep their names: caffe.net_spec, caffe.coord_map (caffe-blob),
caffe.io, caffe.draw, caffe.classifier, caffe.detector (caffe-net), each loaded on
first use (`import caffe.io` or the attribute). As pycaffe's `import caffe` does,
this loads caffe.proto and sends Caffe's log lines to stderr (caffe.blob.glog).
"""
import os as _os
from pkgutil import extend_path

# Thread pools share few cores: the Cython kernels' OpenMP threads and OpenBLAS's GEMM threads. Threads
# that spin-wait long after their work starve the other pool (LeNet ran 30x slower on 2 cores with libgomp's
# default of 300,000 spins); threads that sleep at once pay a wake-up at the next kernel (a futex, on a VM a
# halted vCPU's wake: ~0.07 ms a parallel region on the development VM, a quarter to a third of a batch-1
# ResNet-50 / GoogLeNet / MobileNet forward). So libgomp's threads spin briefly, ~GOMP_SPIN_NS, and then sleep.
# GOMP_SPINCOUNT counts PAUSEs, whose length differs between CPUs, so the count is the time over one PAUSE's,
# measured here (caffe._spin): 3000 on Zen 5 (~26 ns a PAUSE; bench/README.md, session 14: inference 0.59-0.80x
# the time of no spin at batch 1, 0.71-0.91x at 8; 100,000 spins made LeNet's training 1.5x slower), ~8000 on
# the Xeon VM of session 19 (~10 ns a PAUSE; 3000 there spun 0.03 ms: LeNet training 0.93x, ResNet-50,
# MobileNet v2, SqueezeNet at batch 1 0.90-0.94x the time with 8000). Both settings are read when the
# libraries load, so they are made here, first, unless the user chose either (then libgomp's rules stand).
# (thread_env_set: the names set here, not by the user: a benchmark drops them from the environment of a
# process it starts for another framework, whose thread pools then run with their own defaults)
GOMP_SPIN_NS = 80_000
_GOMP_SPINCOUNT_RANGE = (1_000, 100_000)


def gomp_spincount(pause_ns: float) -> int:
    """GOMP_SPINCOUNT for a spin of ~GOMP_SPIN_NS, given one PAUSE's time (3000 when it is unknown: 0)."""
    if not pause_ns > 0:
        return 3000
    lo, hi = _GOMP_SPINCOUNT_RANGE
    return int(min(hi, max(lo, round(GOMP_SPIN_NS / pause_ns, -2))))


_THREAD_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")
_users_thread_env = {n for n in _THREAD_ENV if n in _os.environ}
if not _users_thread_env & {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}:
    try:
        from caffe._spin import pause_ns as _pause_ns  # (a C extension that loads no OpenMP runtime)
        _os.environ["GOMP_SPINCOUNT"] = str(gomp_spincount(_pause_ns()))
    except ImportError:  # a source tree whose extensions are not built
        _os.environ["GOMP_SPINCOUNT"] = str(gomp_spincount(0.0))
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_openblas_loaded_first = "numpy" in __import__("sys").modules and "OPENBLAS_THREAD_TIMEOUT" not in _os.environ
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
thread_env_set = tuple(n for n in _THREAD_ENV if n in _os.environ and n not in _users_thread_env)

__path__ = extend_path(__path__, __name__)

# Test support: CAFFE_CUPY_STANDIN=1 replaces CuPy by a NumPy stand-in (no GPU) before anything imports it,
# in this process and in every rank it spawns (caffe.blob._standin; scripts/test.sh's GPU run).
if _os.environ.get("CAFFE_CUPY_STANDIN"):
    from caffe.blob._standin import install_from_env as _standin
    _standin()

# A script that imports NumPy first (most do) loaded OpenBLAS before the setting above: make it read it now.
if _openblas_loaded_first:
    from caffe.blob.blas_spin import reread_thread_timeout as _reread
    _reread()

from caffe import proto  # noqa: E402  pycaffe's `import caffe` loads caffe.proto.caffe_pb2
from caffe.proto import caffe_pb2 as _caffe_pb2  # noqa: E402
from caffe.blob import Blob  # noqa: E402
from caffe.blob.context import (  # noqa: E402
    set_mode_cpu, set_mode_gpu, set_device, set_random_seed, set_solver_count, solver_count,
    set_solver_rank, solver_rank, set_multiprocess, multiprocess, root_solver, device_query,
)
from caffe.blob.glog import init_log, log, install_default as _install_default_log  # noqa: E402
from caffe.blob.timer import Timer  # noqa: E402
from caffe.net_spec import NetSpec, to_proto, params  # noqa: E402

TRAIN = _caffe_pb2.TRAIN
TEST = _caffe_pb2.TEST


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("caffe-blob")
    except Exception:  # running from a source tree without metadata
        return "0+unknown"


__version__ = _version()
_install_default_log()

# pycaffe name -> (module that defines it, distribution that ships it)
_LAZY = {
    "Layer": ("caffe.layers", "caffe-layers"),
    "Net": ("caffe.net", "caffe-net"),
    "Classifier": ("caffe.net", "caffe-net"),
    "Detector": ("caffe.detector", "caffe-net"),
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
# pycaffe modules (and this project's subpackages) that `caffe.<name>` loads on first use
_MODULES = {
    "io": "caffe-net", "draw": "caffe-net", "classifier": "caffe-net", "detector": "caffe-net",
    "coord_map": "caffe-blob", "net_spec": "caffe-blob", "blob": "caffe-blob", "layers": "caffe-layers",
    "net": "caffe-net", "solver": "caffe-solver", "parallel": "caffe-parallel", "cli": "caffe-cli",
}


def layer_type_list() -> list:
    """Every registered layer type, sorted (RNN and LSTM too, which caffe-net registers)."""
    from caffe.layers import layer_type_list as _registered
    try:
        import caffe.net  # noqa: F401  registers RNN and LSTM
    except ModuleNotFoundError as exc:
        if exc.name not in ("caffe.net",):
            raise
    return _registered()


def _import(module_name: str, name: str, dist: str):
    import importlib
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise AttributeError(f"caffe.{name} needs the {dist} package: pip install {dist}") from None
        raise


def __getattr__(name):
    if name in _MODULES:
        if name == "layers":
            # pycaffe's `from caffe import layers as L`: the layer package answers L.<Type> with
            # NetSpec builders; with only caffe-blob installed, NetSpec's own builder object does
            try:
                value = _import("caffe.layers", name, _MODULES[name])
            except AttributeError:
                from caffe.net_spec import layers as value
        else:
            value = _import(f"caffe.{name}", name, _MODULES[name])
    elif name in _LAZY:
        module_name, dist = _LAZY[name]
        value = getattr(_import(module_name, name, dist), name)
    else:
        raise AttributeError(f"module 'caffe' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))
