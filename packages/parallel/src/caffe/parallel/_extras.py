"""Optional dependencies: mpi4py (the `mpi` extra) and CuPy's NCCL bindings (the `nccl` extra).

Both are imported only when used, and a missing one is answered with the pip command that installs it.
"""
from __future__ import annotations

MPI_EXTRA = "pip install 'caffe-parallel[mpi]'"
NCCL_EXTRA = "pip install 'caffe-parallel[nccl]' (CUDA 12; 'caffe-parallel[nccl-cuda13]' for CUDA 13)"


class MissingExtraError(ImportError):
    """An optional dependency of caffe-parallel is missing; the message names the extra to install."""


def require_mpi(what: str = "MPI training"):
    """Return mpi4py's MPI module, or raise MissingExtraError naming the `mpi` extra."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs mpi4py, which cannot be imported ({exc}): {MPI_EXTRA} "
            f"(mpi4py, plus the mpich wheel that provides mpiexec where no MPI is installed)") from None
    except RuntimeError as exc:  # mpi4py is there but cannot load an MPI library
        raise MissingExtraError(f"{what}: mpi4py cannot load an MPI library ({exc}): {MPI_EXTRA}") from None
    return MPI


def nccl_module():
    """CuPy's NCCL bindings if CuPy and the NCCL library are installed, else None (no GPU needed)."""
    try:
        # `cupy` first: `from cupy.cuda import nccl` alone would find an already imported cupy.cuda.nccl in
        # sys.modules even where cupy itself cannot be imported (or is hidden, as the tests do)
        import cupy  # noqa: F401
        from cupy.cuda import nccl
    except Exception:  # ImportError, or CuPy failing to load its CUDA libraries
        return None
    return nccl if getattr(nccl, "available", False) else None


def require_nccl(what: str = "NCCL"):
    """Return (cupy, cupy.cuda.nccl), or raise MissingExtraError naming the `nccl` extra."""
    try:
        import cupy
    except Exception as exc:
        raise MissingExtraError(f"{what} needs CuPy, which cannot be imported ({exc}): {NCCL_EXTRA}") from None
    nccl = nccl_module()
    if nccl is None:
        raise MissingExtraError(f"{what} needs the NCCL library for CuPy (cupy.cuda.nccl is not available): "
                                f"{NCCL_EXTRA}")
    return cupy, nccl
