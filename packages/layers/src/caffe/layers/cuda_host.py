"""Test support: the hand-written CUDA kernels (caffe.layers.cuda_kernels, caffe.layers.kernels.cuda_*) run
on the host, so their indexing and arithmetic are checked where no GPU exists (NOT a GPU, never used by users).

A kernel source is compiled by the host C++ compiler behind a small prelude that defines CUDA's builtins:
threadIdx / blockIdx thread-local, blockDim / gridDim set per launch, __shared__ as static (one block runs
at a time, so static storage is the block's shared memory) and __syncthreads() as a barrier of the block's
threads. A launch runs its blocks one after another, each as `block` real threads (at most EMU_THREADS, so
every kernel must be correct for any power-of-two block size: the grid-stride loops and block reductions
here are), which meet at each __syncthreads(). What it cannot show: GPU timing, warp-level behaviour,
races the host schedules away, CUDA's own math library (expf etc. differ in the last bits).

    with cuda_host.emulating():   # device.kernels(np) is true and device.raw_kernel compiles for the host
        pool_device.max_backward(np, ...)

available() is false where no C++ compiler is found (tests skip). CAFFE_CUDA_HOST_FLAGS adds compiler flags:
with -fsanitize=address (and libasan preloaded, ASAN_OPTIONS=detect_leaks=0) out-of-bounds reads and writes
of the kernels are reported. nvrtc_compile() compiles a source with
NVIDIA's runtime compiler, the one CuPy's RawModule uses, where libnvrtc is found (a CUDA toolkit, or the
nvidia-cuda-nvrtc wheel; no GPU needed): the real CUDA front end, without running anything.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np

from caffe.layers import device

# Threads per emulated block (a power of two): few, so strides and reductions wrap often; CAFFE_CUDA_HOST_THREADS
# sets it (e.g. 64: more interleavings at the barriers).
EMU_THREADS = int(os.environ.get("CAFFE_CUDA_HOST_THREADS", "4"))

_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <pthread.h>
using namespace std;
struct emu_dim3 { unsigned int x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;
static pthread_barrier_t emu_barrier;
static bool emu_barrier_ready = false;
extern "C" void emu_set_launch(unsigned int grid, unsigned int block) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  if (emu_barrier_ready) pthread_barrier_destroy(&emu_barrier);
  pthread_barrier_init(&emu_barrier, nullptr, block);
  emu_barrier_ready = true;
}
extern "C" void emu_set_thread(unsigned int block, unsigned int thread) {
  blockIdx = {block, 0, 0};
  threadIdx = {thread, 0, 0};
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() pthread_barrier_wait(&emu_barrier)
"""

_lock = threading.Lock()
_libs: dict = {}


def compiler():
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def available() -> bool:
    return compiler() is not None


def _library(source: str, ctype: str):
    code = f"{_PRELUDE}\ntypedef {ctype} T;\n{source}"
    key = hashlib.sha256((code + os.environ.get("CAFFE_CUDA_HOST_FLAGS", "")).encode()).hexdigest()[:24]
    lib = _libs.get(key)
    if lib is not None:
        return lib
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            folder = os.path.join(tempfile.gettempdir(), f"caffe_cuda_host_{os.getuid()}")
            os.makedirs(folder, exist_ok=True)
            so = os.path.join(folder, f"{key}.so")
            if not os.path.exists(so):
                src = os.path.join(folder, f"{key}.{os.getpid()}.cpp")
                with open(src, "w") as f:
                    f.write(code)
                tmp = f"{so}.{os.getpid()}.tmp"
                extra = os.environ.get("CAFFE_CUDA_HOST_FLAGS", "").split()  # e.g. -fsanitize=address
                r = subprocess.run([compiler(), "-std=c++11", "-O1", "-shared", "-fPIC", "-pthread", "-Wall",
                                    "-Wno-unused-function", "-Wno-unused-variable", *extra, "-o", tmp, src],
                                   capture_output=True, text=True)
                os.unlink(src)
                if r.returncode != 0:
                    raise RuntimeError(f"the CUDA source does not compile on the host:\n{r.stderr[-4000:]}")
                os.replace(tmp, so)  # atomic: a parallel run never loads half a library
            lib = _libs[key] = ctypes.CDLL(so)
    return lib


_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def _arg(a):
    if isinstance(a, np.ndarray):
        return ctypes.c_void_p, ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.generic) and a.dtype in _CTYPES:
        t = _CTYPES[a.dtype]
        return t, t(a.item())
    raise TypeError(f"kernel argument {a!r} ({type(a).__name__}): pass ndarrays or sized NumPy scalars, "
                    "as a CuPy RawKernel needs them")


class HostKernel:
    """A CUDA kernel of a source, compiled for the host: kernel((grid,), (block,), args) as CuPy's."""

    def __init__(self, name, source, dtype):
        self.name = name
        self.lib = _library(source, device.CTYPES[np.dtype(dtype)])
        self.fn = getattr(self.lib, name)
        self.fn.restype = None

    def __call__(self, grid, block, args):
        grid, block = int(grid[0]), min(int(block[0]), EMU_THREADS)
        types, values = zip(*(_arg(a) for a in args)) if args else ((), ())
        self.fn.argtypes = list(types)
        errors = []

        def thread(b, t):
            try:
                self.lib.emu_set_thread(b, t)
                self.fn(*values)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        with _lock:  # one launch at a time: the barrier and the __shared__ statics are the emulator's
            self.lib.emu_set_launch(grid, block)
            for b in range(grid):
                threads = [threading.Thread(target=thread, args=(b, t), daemon=True) for t in range(block)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(60)
                    if th.is_alive():
                        raise RuntimeError(f"{self.name}: block {b} hangs (a __syncthreads() not reached by "
                                           "every thread of the block?)")
        if errors:
            raise errors[0]


@contextlib.contextmanager
def emulating():
    """Within: device.kernels(numpy) is true, device.raw_kernel builds HostKernels: the kernel entry points
    run their CUDA sources on NumPy arrays."""
    saved = device.kernels, device.raw_kernel
    device.kernels = lambda xp: True
    device.raw_kernel = HostKernel
    try:
        yield
    finally:
        device.kernels, device.raw_kernel = saved


def _nvrtc():
    """libnvrtc (ctypes), or None: CAFFE_NVRTC names it; else the nvidia-cuda-nvrtc wheel's, a toolkit's, the
    loader's."""
    names = [os.environ.get("CAFFE_NVRTC", "")]
    try:
        import nvidia.cuda_nvrtc as wheel  # the nvidia-cuda-nvrtc-cu12/13 wheel (CuPy's cuda extras use it)
        for d in list(getattr(wheel, "__path__", [])):
            names += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    names.append(ctypes.util.find_library("nvrtc") or "")
    for name in names:
        if name and "builtins" not in name and "alt" not in os.path.basename(name):
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    return None


def nvrtc_available() -> bool:
    return _nvrtc() is not None


def nvrtc_compile(source: str, ctype: str, arch: str = "compute_75"):
    """(ok, log) of compiling `typedef ctype T;` + source as caffe.layers.device.raw_kernel does."""
    lib = _nvrtc()
    if lib is None:
        raise RuntimeError("libnvrtc not found (CAFFE_NVRTC names it)")
    prog = ctypes.c_void_p()
    code = f"typedef {ctype} T;\n{source}".encode()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), code, b"caffe_kernels.cu", 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [b"--std=c++11", f"-arch={arch}".encode()]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status == 0, log.value.decode(errors="replace")
