"""The communicator interface shared by the NCCL (GPU) and MPI (CPU) backends.

A communicator joins `size` ranks. Every collective is called by all ranks in the same order:
`allreduce` sums a contiguous buffer in place, `iallreduce` starts that sum and returns a request
that `wait` completes (so the layer-wise reduce can overlap the rest of backward), `bcast` copies
root's buffer to every rank, `barrier` waits for all ranks. Buffers are NumPy arrays for MPI and
CuPy arrays for NCCL (the reducer picks the backend matching the mode).
"""
from __future__ import annotations

from abc import ABC, abstractmethod


class ParallelError(RuntimeError):
    """A data-parallel training setup or run failed (a rank died, ranks disagree, bad launch arguments)."""


class Communicator(ABC):
    rank: int = 0
    size: int = 1
    # "numpy" buffers (host memory) or "cupy" buffers (device memory)
    array_module: str = "numpy"
    # where training is ("iteration 12"), set by the reducer, for error messages
    where: str = ""

    @abstractmethod
    def allreduce(self, buf) -> None:
        """Sum `buf` over all ranks, in place."""

    def iallreduce(self, buf):
        """Start an in-place sum and return a request for `wait`; the default completes at once."""
        self.allreduce(buf)
        return None

    def wait(self, requests) -> None:
        """Complete requests returned by `iallreduce`."""

    @abstractmethod
    def bcast(self, buf, root: int = 0) -> None:
        """Copy root's `buf` into every rank's `buf`."""

    @abstractmethod
    def barrier(self) -> None:
        """Return when every rank has called barrier."""

    def allgather_object(self, obj) -> list:
        """Every rank's `obj`, indexed by rank (for start-up checks; not on the training path)."""
        raise NotImplementedError(f"{type(self).__name__} cannot gather Python objects")

    def abort(self, message: str, code: int = 1) -> None:
        """Stop every rank with a message (default: raise here; MPI aborts the whole job)."""
        raise ParallelError(message)

    def close(self) -> None:
        """Release resources (watchdog threads, NCCL communicators)."""
