"""Hand-written CUDA kernels (ElementwiseKernel, ReductionKernel, RawKernel, RawModule) cannot run on the
stand-in: they are created as CuPy creates them (lazily), and any launch raises NotImplementedError.

Code that uses such a kernel keeps the array-API path it replaces and chooses the kernel only where
`caffe.blob.context.device_kernels_available()` is true (a real GPU), so both paths stay tested.
"""
from __future__ import annotations


class DeviceKernelUnavailable(NotImplementedError):
    """A CUDA kernel was launched on the CuPy stand-in (no GPU)."""


def _refuse(kind: str, name: str):
    raise DeviceKernelUnavailable(
        f"{kind} {name!r}: a hand-written CUDA kernel needs a real GPU and cannot run on the CuPy stand-in "
        "(CAFFE_CUPY_STANDIN=1, NumPy on the host). Keep the array-API path it replaces and choose the kernel "
        "only when caffe.blob.context.device_kernels_available() is true.")


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, **kwargs):
        self.in_params, self.out_params, self.operation, self.name = in_params, out_params, operation, name

    def __call__(self, *args, **kwargs):
        _refuse("ElementwiseKernel", self.name)


class ReductionKernel:
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name="reduce_kernel",
                 **kwargs):
        self.name = name

    def __call__(self, *args, **kwargs):
        _refuse("ReductionKernel", self.name)


class RawKernel:
    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        self.code, self.name = code, name

    def __call__(self, grid, block, args, **kwargs):
        _refuse("RawKernel", self.name)

    @property
    def attributes(self):
        _refuse("RawKernel", self.name)


class RawModule:
    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        self.code, self.path = code, path

    def get_function(self, name) -> RawKernel:
        return RawKernel(self.code, name)
