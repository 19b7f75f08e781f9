"""A strict CuPy stand-in for tests: NumPy on the host behind CuPy's API, with fake devices and NCCL.

Test support only; it is never a GPU. It lets CI run every GPU-mode code path without a GPU and
catches what breaks first on a real one: implicit host<->device conversions (a device array refuses
`np.asarray`, host operands and `dev[...] = host`, as CuPy's does), arrays used on another device
than the current one, NCCL ranks that disagree. It counts every host<->device transfer (`transfers`).
What it cannot show: GPU numerics (cuBLAS, atomics, reduction order), asynchrony and races between
streams, memory pools, and hand-written kernels (ElementwiseKernel/RawKernel launches raise
NotImplementedError: keep them behind `caffe.blob.context.device_kernels_available()`).

Enable it with CAFFE_CUPY_STANDIN=1 before anything imports `cupy` (`import caffe` then installs it, in
every process, spawned ranks included), or call `install()` first thing. CAFFE_CUPY_STANDIN_DEVICES sets
the number of fake devices (default 2). `bash scripts/test.sh` runs the GPU-marked tests under it.
"""
from __future__ import annotations

import os
import sys
import types

import numpy as np

from caffe.blob._standin._memory import TransferCounter, transfers  # noqa: F401 (public)

ENV = "CAFFE_CUPY_STANDIN"
_NAMES = ("cupy", "cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.nccl", "cupy.cuda.memory", "cupy.cuda.stream",
          "cupy.cuda.device", "cupy.cuda.pinned_memory", "cupy.random", "cupy.linalg", "cupyx")
_modules: dict[str, types.ModuleType] = {}
_saved: dict[str, object] = {}


def notice() -> str:
    from caffe.blob._standin import _state
    return (f"CuPy stand-in active ({ENV}=1): `cupy` is NumPy on the host with {_state.device_count()} fake "
            "device(s); NO GPU RAN. GPU-mode tests check the device plumbing (no implicit host<->device "
            "conversion, devices, streams, NCCL ranks), not GPU numerics, kernels or speed.")


def enabled_by_env() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _build() -> dict[str, types.ModuleType]:
    if _modules:
        return _modules
    from caffe.blob._standin import _functions, _kernels, cuda, cupyx, nccl, random, runtime
    from caffe.blob._standin._ndarray import ndarray

    cupy = types.ModuleType("cupy", "CuPy stand-in (caffe.blob._standin): NumPy on the host, NOT a GPU.")
    for name in dir(_functions):
        obj = getattr(_functions, name)
        if not name.startswith("_") and (callable(obj) or isinstance(obj, _functions.ufunc)):
            setattr(cupy, name, obj)
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "bool_", "complex64", "complex128", "intp", "uintp", "int_", "intc", "uintc", "byte",
                 "ubyte", "short", "ushort", "longlong", "ulonglong", "half", "single", "double", "csingle",
                 "cdouble", "dtype", "newaxis", "pi", "e", "inf", "nan", "finfo", "iinfo", "integer", "floating",
                 "number", "generic", "signedinteger", "unsignedinteger", "complexfloating", "inexact",
                 "can_cast", "promote_types", "common_type", "min_scalar_type", "issubdtype", "euler_gamma"):
        if hasattr(np, name):
            setattr(cupy, name, getattr(np, name))
    cupy.bool = np.bool_
    cupy.ndarray = ndarray
    cupy.ufunc = _functions.ufunc
    for name in ("ElementwiseKernel", "ReductionKernel", "RawKernel", "RawModule"):
        setattr(cupy, name, getattr(_kernels, name))
    pool, pinned_pool = cuda.MemoryPool(), cuda.PinnedMemoryPool()
    cupy.get_default_memory_pool = lambda: pool
    cupy.get_default_pinned_memory_pool = lambda: pinned_pool
    cupy.is_available = cuda.is_available
    cupy.show_config = lambda *a, **k: print(notice())
    cupy.__version__ = "14.0.0+caffe.standin"
    cupy.__caffe_standin__ = True
    cupy.__path__ = []  # a package, so `import cupy.cuda` resolves through sys.modules

    linalg = types.ModuleType("cupy.linalg")
    for name in ("norm", "inv", "solve", "det", "svd", "qr", "eigh", "eigvalsh", "cholesky", "pinv", "matrix_power",
                 "lstsq", "slogdet", "matrix_rank", "tensorsolve", "tensorinv"):
        setattr(linalg, name, _functions._routine(getattr(np.linalg, name), name))

    cuda.runtime, cuda.nccl = runtime, nccl
    cuda.memory = cuda.stream = cuda.device = cuda.pinned_memory = cuda
    cuda.__path__ = []
    cupy.cuda, cupy.random, cupy.linalg = cuda, random, linalg
    cupyx.__path__ = []
    cupy.__caffe_transfers__ = transfers
    _modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy.cuda.nccl": nccl,
                     "cupy.cuda.memory": cuda, "cupy.cuda.stream": cuda, "cupy.cuda.device": cuda,
                     "cupy.cuda.pinned_memory": cuda, "cupy.random": random, "cupy.linalg": linalg,
                     "cupyx": cupyx})
    return _modules


def module():
    """The stand-in's `cupy` module, without installing it (tests of the stand-in itself use this)."""
    return _build()["cupy"]


def module_for(numpy_module: str):
    """The stand-in module matching a NumPy module name (for __array_function__), or None."""
    mods = _build()
    if numpy_module == "numpy":
        return mods["cupy"]
    if numpy_module.startswith("numpy."):
        return mods.get("cupy." + numpy_module.split(".", 1)[1])
    return None


def installed() -> bool:
    return getattr(sys.modules.get("cupy"), "__caffe_standin__", False)


def install() -> None:
    """Put the stand-in in sys.modules as `cupy` (and its submodules, and `cupyx`)."""
    if installed():
        return
    existing = sys.modules.get("cupy")
    if existing is not None:
        raise RuntimeError(f"{ENV}: the real CuPy ({getattr(existing, '__file__', '?')}) is already imported; "
                           "the stand-in must be installed before anything imports cupy")
    mods = _build()
    for name in _NAMES:
        if name in sys.modules:
            _saved[name] = sys.modules[name]
        sys.modules[name] = mods[name]
    _reset_probe()


def uninstall() -> None:
    """Take the stand-in out of sys.modules again (restoring whatever was there)."""
    if not installed():
        return
    for name in _NAMES:
        sys.modules.pop(name, None)
        if name in _saved:
            sys.modules[name] = _saved.pop(name)
    _reset_probe()


def _reset_probe() -> None:
    ctx = sys.modules.get("caffe.blob.context")
    if ctx is not None:
        ctx._gpu_probe = None


def install_from_env() -> bool:
    """Install when CAFFE_CUPY_STANDIN is set (called by `import caffe`); True when the stand-in is in use."""
    if enabled_by_env():
        install()
        return True
    return False
