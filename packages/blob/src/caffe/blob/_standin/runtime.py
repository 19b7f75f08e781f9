"""Stand-in for `cupy.cuda.runtime`: device count and properties, device selection, memcpy."""
from __future__ import annotations

import numpy as np

from caffe.blob._standin import _state
from caffe.blob._standin._memory import host_view, registry, transfers

is_hip = False

memcpyHostToHost = 0
memcpyHostToDevice = 1
memcpyDeviceToHost = 2
memcpyDeviceToDevice = 3
memcpyDefault = 4

_TOTAL_MEM = 16 << 30


class CUDARuntimeError(RuntimeError):
    """As cupy_backends.cuda.api.runtime.CUDARuntimeError."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def _invalid_device(i) -> CUDARuntimeError:
    return CUDARuntimeError(101, f"cudaErrorInvalidDevice: invalid device ordinal (device {i} of the CuPy stand-in's "
                                 f"{_state.device_count()})")


def check_device(i: int) -> int:
    i = int(i)
    if not 0 <= i < _state.device_count():
        raise _invalid_device(i)
    return i


def getDeviceCount() -> int:
    n = _state.device_count()
    if n == 0:
        raise CUDARuntimeError(100, "cudaErrorNoDevice: no CUDA-capable device is detected (CuPy stand-in with "
                                    "CAFFE_CUPY_STANDIN_DEVICES=0)")
    return n


def getDevice() -> int:
    return _state.current_device()


def setDevice(i: int) -> None:
    _state.set_current_device(check_device(i))


def deviceSynchronize() -> None:
    pass  # every stand-in operation has finished when it returns


def runtimeGetVersion() -> int:
    return 12080


def driverGetVersion() -> int:
    return 12080


def getDeviceProperties(i: int) -> dict:
    i = check_device(i)
    return {
        "name": f"CuPy stand-in device {i} (NumPy on the host: NOT a GPU)".encode(),
        "totalGlobalMem": _TOTAL_MEM, "sharedMemPerBlock": 49152, "regsPerBlock": 65536, "warpSize": 32,
        "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64), "maxGridSize": (2**31 - 1, 65535, 65535),
        "clockRate": 0, "totalConstMem": 65536, "major": 0, "minor": 0, "multiProcessorCount": 1,
        "pciBusID": i, "pciDeviceID": 0, "integrated": 0, "canMapHostMemory": 1,
    }


def memGetInfo() -> tuple[int, int]:
    used = registry.used_bytes(_state.current_device())
    return max(0, _TOTAL_MEM - used), _TOTAL_MEM


def deviceCanAccessPeer(device: int, peer: int) -> int:
    check_device(device)
    check_device(peer)
    return 1


def deviceEnablePeerAccess(peer: int) -> None:
    check_device(peer)


def _side(ptr: int, nbytes: int, device_side: bool, what: str) -> np.ndarray:
    if device_side:
        return registry.resolve(ptr, nbytes, what)[0]
    if nbytes and registry.is_device_pointer(ptr):
        raise ValueError(f"{what}: pointer {int(ptr):#x} is device memory but the copy kind says host")
    return host_view(ptr, nbytes)


def memcpy(dst: int, src: int, size: int, kind: int) -> None:
    """cudaMemcpy between raw pointers; device pointers must lie in stand-in device allocations."""
    size = int(size)
    if kind == memcpyDefault:
        d_dev, s_dev = registry.is_device_pointer(dst), registry.is_device_pointer(src)
    elif kind in (memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice):
        d_dev, s_dev = kind in (memcpyHostToDevice, memcpyDeviceToDevice), kind in (memcpyDeviceToHost,
                                                                                   memcpyDeviceToDevice)
    else:
        raise CUDARuntimeError(21, f"cudaErrorInvalidMemcpyDirection: kind {kind}")
    d = _side(dst, size, d_dev, "runtime.memcpy dst")
    s = _side(src, size, s_dev, "runtime.memcpy src")
    d[...] = s
    if d_dev and not s_dev:
        transfers.record("h2d", size)
    elif s_dev and not d_dev:
        transfers.record("d2h", size)


def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int = 0) -> None:
    memcpy(dst, src, size, kind)
