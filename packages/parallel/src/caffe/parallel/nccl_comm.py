"""NCCL backend (CuPy's cupy.cuda.nccl) for device buffers: one process per GPU, joined by a unique id.

Kept small and separate: it is the only module that touches NCCL. As in Caffe's NCCL class, the
whole reduce runs on the compute (current) stream, so the scale and the update that follow are
ordered after it; the layer-wise reduce runs on a stream of its own after the compute stream has
finished the layer's gradients, and `wait` synchronizes that stream.
"""
from __future__ import annotations

from caffe.parallel._extras import require_nccl
from caffe.parallel.comm import Communicator


def new_uid():
    """A fresh NCCL unique id (bytes in CuPy >= 14): create it once and give it to every rank."""
    _, nccl = require_nccl("NCCL.new_uid")
    return nccl.get_unique_id()


class NCCLCommunicator(Communicator):
    """Rank `rank` of `size` in the NCCL clique named by `uid`, on the current CUDA device."""

    array_module = "cupy"

    def __init__(self, size: int, uid, rank: int):
        cupy, nccl = require_nccl("the NCCL communicator")
        if not 0 <= rank < size:
            raise ValueError(f"NCCL rank {rank} is outside 0..{size - 1}")
        self.cupy, self.nccl = cupy, nccl
        self._comm = nccl.NcclCommunicator(int(size), uid, int(rank))
        self.rank, self.size = int(rank), int(size)
        self.stream = cupy.cuda.Stream(non_blocking=True)  # Caffe's stream_ for the layer-wise reduce
        self._types = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                       "float16": nccl.NCCL_FLOAT16}

    def _dtype(self, buf) -> int:
        if not isinstance(buf, self.cupy.ndarray) or not buf.flags.c_contiguous:
            raise TypeError("NCCL collectives need a C-contiguous CuPy array")
        try:
            return self._types[buf.dtype.name]
        except KeyError:
            raise TypeError(f"NCCL: unsupported dtype {buf.dtype}") from None

    def allreduce(self, buf, stream=None) -> None:
        stream = self.cupy.cuda.get_current_stream() if stream is None else stream
        self._comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf), self.nccl.NCCL_SUM,
                             stream.ptr)

    def iallreduce(self, buf):
        # the gradients were computed on the current stream: let it finish before NCCL reads them
        self.cupy.cuda.get_current_stream().synchronize()
        self.allreduce(buf, stream=self.stream)
        return self.stream

    def wait(self, requests) -> None:
        if requests:
            self.stream.synchronize()

    def bcast(self, buf, root: int = 0) -> None:
        stream = self.cupy.cuda.get_current_stream()
        self._comm.bcast(buf.data.ptr, buf.size, self._dtype(buf), int(root), stream.ptr)
        stream.synchronize()

    def barrier(self) -> None:
        token = self.cupy.zeros(1, self.cupy.float32)
        self.allreduce(token)
        self.cupy.cuda.get_current_stream().synchronize()

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()
