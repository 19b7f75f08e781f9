"""pycaffe's `caffe.NCCL`: one process per GPU, joined by an NCCL unique id (Caffe's train.py).

    uid = caffe.NCCL.new_uid()              # once, in the parent; passed to every rank
    # in rank r's process:
    caffe.set_mode_gpu(); caffe.set_device(gpus[r])
    caffe.set_solver_count(len(gpus)); caffe.set_solver_rank(r); caffe.set_multiprocess(True)
    solver = caffe.SGDSolver(proto)
    nccl = caffe.NCCL(solver, uid)
    nccl.bcast()
    solver.add_callback(nccl)
    if solver.param.layer_wise_reduce:
        solver.net.after_backward(nccl)
    solver.step(solver.param.max_iter)
"""
from __future__ import annotations

from caffe.blob import context
from caffe.parallel._extras import nccl_module, require_nccl
from caffe.parallel.comm import ParallelError
from caffe.parallel.nccl_comm import NCCLCommunicator, new_uid
from caffe.parallel.reducer import GradientReducer


def has_nccl() -> bool:
    """True when CuPy and its NCCL bindings are installed (pycaffe's caffe.has_nccl)."""
    return nccl_module() is not None


class NCCL(GradientReducer):
    """Caffe's NCCL<Dtype>: contiguous GPU parameter buffers, broadcast from rank 0, gradient allreduce."""

    def __init__(self, solver, uid=None):
        cupy, _ = require_nccl("caffe.NCCL")
        if uid is None:
            raise ParallelError("caffe.NCCL(solver) without a uid is Caffe's single-process multi-GPU mode, which "
                                "this implementation replaces by one process per GPU: create uid = "
                                "caffe.NCCL.new_uid() once and call caffe.NCCL(solver, uid) in every rank "
                                "(caffe.parallel.launch.train_multi_gpu does this)")
        if context.mode() != context.GPU:
            raise ParallelError("caffe.NCCL needs GPU mode (caffe.set_mode_gpu() and caffe.set_device(id) "
                                "before building the solver); CPU ranks use caffe.parallel.MPIReducer")
        context.set_multiprocess(True)
        comm = NCCLCommunicator(context.solver_count(), uid, context.solver_rank())
        super().__init__(solver, comm, xp=cupy)

    new_uid = staticmethod(new_uid)
