"""`MPIReducer`: the NCCL class's CPU analogue over MPI, for ranks on CPUs and across machines.

    from mpi4py import MPI
    caffe.set_solver_count(MPI.COMM_WORLD.size); caffe.set_solver_rank(MPI.COMM_WORLD.rank)
    caffe.set_multiprocess(True)
    solver = caffe.SGDSolver(proto)
    mpi = caffe.parallel.MPIReducer(solver)
    mpi.bcast()
    solver.add_callback(mpi)
    if solver.param.layer_wise_reduce:
        solver.net.after_backward(mpi)   # non-blocking Iallreduce per layer, completed at on_gradients_ready
    solver.step(solver.param.max_iter)
"""
from __future__ import annotations

import logging
import os

import numpy as np

from caffe.blob import context
from caffe.parallel.comm import ParallelError
from caffe.parallel.mpi_comm import MPICommunicator
from caffe.parallel.reducer import GradientReducer

log = logging.getLogger("caffe.parallel")

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_limits = None  # keeps threadpoolctl's limits in force


def cpus_available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def limit_threads_per_rank(ranks_here: int) -> int | None:
    """Share this machine's CPUs between the ranks running on it: BLAS and OpenMP threads per rank =
    CPUs // ranks. Several ranks each running as many threads as there are CPUs (plus MPI polling)
    oversubscribe the machine and run many times slower. Returns the limit applied, or None when the
    user set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS (respected) or nothing was needed.
    Uses threadpoolctl (in the `mpi` extra); without it, logs how to set the variables instead."""
    global _limits
    if ranks_here <= 1 or any(os.environ.get(v) for v in _THREAD_VARS):
        return None
    per_rank = max(1, cpus_available() // ranks_here)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.warning("%d ranks share this machine's %d CPUs, and each may start a BLAS/OpenMP thread per CPU: "
                    "set OMP_NUM_THREADS=%d (e.g. mpiexec -genv OMP_NUM_THREADS %d ...) or install threadpoolctl "
                    "(pip install 'caffe-parallel[mpi]')", ranks_here, cpus_available(), per_rank, per_rank)
        return None
    _limits = threadpool_limits(limits=per_rank)
    return per_rank


class MPIReducer(GradientReducer):
    """Host-memory gradient reducer over MPI (default: MPI.COMM_WORLD with a watchdog, see mpi_comm).

    With `limit_threads` (default) the ranks sharing a machine split its CPUs between their BLAS and
    OpenMP thread pools (see limit_threads_per_rank)."""

    def __init__(self, solver, comm: MPICommunicator | None = None, timeout: float | None = None,
                 limit_threads: bool = True):
        if context.mode() == context.GPU:
            raise ParallelError("MPIReducer reduces host memory; in GPU mode use caffe.NCCL (the uid can travel "
                                "over MPI: caffe.parallel.launch.train_mpi does this)")
        if comm is None:
            comm = MPICommunicator(timeout=timeout)
        super().__init__(solver, comm, xp=np)
        if limit_threads:
            here = sum(1 for host, _ in comm.peers if host == comm.host)
            n = limit_threads_per_rank(here)
            if n is not None and comm.rank == 0:
                log.info("%d ranks on %s: %d BLAS/OpenMP thread(s) per rank", here, comm.host, n)
