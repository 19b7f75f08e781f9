"""caffe.parallel: data-parallel training, as Caffe's NCCL class and train.py do it.

- `NCCL(solver, uid)`, `NCCL.new_uid()`, `has_nccl()`: pycaffe's multi-GPU surface (CuPy + NCCL,
  the `nccl` extra); one process per GPU.
- `MPIReducer(solver)`: the same over MPI for CPU ranks, on one machine or several (the `mpi` extra).
- `caffe.parallel.launch`: `train_multi_gpu` (one spawned process per GPU), `train_mpi` (under
  mpiexec), `mpi_world`.
- `ParamBuffers`: Caffe's contiguous parameter layout; `Communicator`: the backend interface.
"""
from caffe.parallel._extras import MissingExtraError
from caffe.parallel.buffers import ParamBuffers
from caffe.parallel.comm import Communicator, ParallelError
from caffe.parallel.mpi import MPIReducer
from caffe.parallel.nccl import NCCL, has_nccl
from caffe.parallel.reducer import GradientReducer

__all__ = ["NCCL", "has_nccl", "MPIReducer", "GradientReducer", "ParamBuffers", "Communicator",
           "ParallelError", "MissingExtraError"]
