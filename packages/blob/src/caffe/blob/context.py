"""The runtime context: what Caffe's per-thread `Caffe` singleton holds.

Mode (CPU/GPU), device id, random seed and generator, and the data-parallel
coordinates (solver_count, solver_rank, multiprocess). State is per thread, as
in Caffe; `capture()`/`install()` carry it into worker threads the way Caffe's
InternalThread does (same mode, device, solver coordinates, and a seed drawn
from the parent's generator).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, replace

import numpy as np

CPU = 0
GPU = 1


class NoGPUError(RuntimeError):
    """Raised when GPU memory or a GPU mode is requested without a usable GPU."""


@dataclass
class _State:
    mode: int = CPU
    device: int = 0
    random_seed: int = -1
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng())
    solver_count: int = 1
    solver_rank: int = 0
    multiprocess: bool = False


_local = threading.local()


def _state() -> _State:
    st = getattr(_local, "state", None)
    if st is None:
        st = _local.state = _State()
    return st


# --- mode and device -------------------------------------------------------

def mode() -> int:
    return _state().mode


def set_mode_cpu() -> None:
    _state().mode = CPU


def set_mode_gpu() -> None:
    require_gpu("set_mode_gpu")
    _state().mode = GPU


def set_mode(m: int) -> None:
    if m == GPU:
        set_mode_gpu()
    else:
        set_mode_cpu()


def device() -> int:
    return _state().device


def set_device(device_id: int) -> None:
    device_id = int(device_id)
    if device_id < 0:
        raise ValueError(f"set_device: device id must be >= 0, got {device_id}")
    if gpu_available():
        n = gpu_count()
        if device_id >= n:
            raise NoGPUError(f"set_device: GPU {device_id} does not exist ({n} GPU(s) visible)")
        import cupy
        cupy.cuda.Device(device_id).use()
    _state().device = device_id


# --- GPU discovery (CuPy is optional) ---------------------------------------

_gpu_probe: tuple[bool, str] | None = None


def _probe_gpu() -> tuple[bool, str]:
    global _gpu_probe
    if _gpu_probe is None:
        if os.environ.get("CAFFE_DISABLE_GPU"):
            _gpu_probe = (False, "CAFFE_DISABLE_GPU is set")
        else:
            try:
                import cupy
            except ImportError:
                _gpu_probe = (False, "CuPy is not installed (install the 'cuda12' or 'cuda13' extra)")
            else:
                try:
                    n = cupy.cuda.runtime.getDeviceCount()
                    _gpu_probe = (n > 0, f"{n} CUDA device(s)" if n else "no CUDA device found")
                    if cupy_standin():
                        _gpu_probe = (n > 0, f"{n} fake device(s) of the CuPy stand-in (NumPy on the host, no GPU)")
                except Exception as exc:  # CUDARuntimeError without a driver
                    _gpu_probe = (False, f"no usable CUDA device ({exc})")
    return _gpu_probe


def gpu_available() -> bool:
    return _probe_gpu()[0]


def gpu_count() -> int:
    if not gpu_available():
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def cupy_standin() -> bool:
    """True when `cupy` is the test stand-in (caffe.blob._standin: NumPy on the host, not a GPU)."""
    import sys
    return bool(getattr(sys.modules.get("cupy"), "__caffe_standin__", False))


def device_kernels_available() -> bool:
    """True where hand-written CUDA kernels (ElementwiseKernel, RawKernel) can run: a real GPU. Code that
    has one keeps the array-API path it replaces for the other case (the stand-in, or no GPU)."""
    return gpu_available() and not cupy_standin()


def require_gpu(what: str) -> None:
    ok, why = _probe_gpu()
    if not ok:
        raise NoGPUError(f"{what}: a GPU was requested but none is usable: {why}")


def device_query(device_id: int | None = None) -> str:
    """A human-readable report of the GPU, as `caffe device_query` prints, or why there is none."""
    ok, why = _probe_gpu()
    if not ok:
        return f"No GPU available: {why}"
    import cupy
    device_id = device() if device_id is None else device_id
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    lines = [
        f"Device id:                     {device_id}",
        f"Major revision number:         {props['major']}",
        f"Minor revision number:         {props['minor']}",
        f"Name:                          {name}",
        f"Total global memory:           {props['totalGlobalMem']}",
        f"Total shared memory per block: {props['sharedMemPerBlock']}",
        f"Warp size:                     {props['warpSize']}",
        f"Maximum threads per block:     {props['maxThreadsPerBlock']}",
        f"Number of multiprocessors:     {props['multiProcessorCount']}",
    ]
    return "\n".join(lines)


def array_module(m: int | None = None):
    """numpy for CPU mode, cupy for GPU mode."""
    if (mode() if m is None else m) == GPU:
        import cupy
        return cupy
    return np


# --- random numbers --------------------------------------------------------

def set_random_seed(seed: int) -> None:
    """Seed this thread's generator: every filler, dropout mask and shuffle after this is reproducible."""
    st = _state()
    st.random_seed = int(seed)
    st.rng = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)
    if st.mode == GPU and gpu_available():
        import cupy
        cupy.random.seed(int(seed) & 0xFFFFFFFF)


def random_seed() -> int:
    return _state().random_seed


def rng() -> np.random.Generator:
    return _state().rng


# --- data-parallel coordinates --------------------------------------------

def solver_count() -> int:
    return _state().solver_count


def set_solver_count(n: int) -> None:
    if int(n) < 1:
        raise ValueError(f"solver_count must be >= 1, got {n}")
    _state().solver_count = int(n)


def solver_rank() -> int:
    return _state().solver_rank


def set_solver_rank(r: int) -> None:
    if int(r) < 0:
        raise ValueError(f"solver_rank must be >= 0, got {r}")
    _state().solver_rank = int(r)


def multiprocess() -> bool:
    return _state().multiprocess


def set_multiprocess(flag: bool) -> None:
    _state().multiprocess = bool(flag)


def root_solver() -> bool:
    return _state().solver_rank == 0


# --- carrying state into threads (Caffe's InternalThread) -----------------

def capture() -> _State:
    """A copy of this thread's state for a child thread, with a fresh seed drawn from our generator."""
    st = _state()
    seed = int(st.rng.integers(0, 2**63 - 1))
    return replace(st, random_seed=seed, rng=np.random.default_rng(seed))


def install(state: _State) -> None:
    _local.state = replace(state)
    if state.mode == GPU and gpu_available():
        import cupy
        cupy.cuda.Device(state.device).use()
