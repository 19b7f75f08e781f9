"""The gradient reducer: Caffe's NCCL class logic over any Communicator.

Used as a solver callback (`solver.add_callback(r)`: on_start / on_gradients_ready) and, when the
solver asks for `layer_wise_reduce`, as a net callback (`net.after_backward(r)`: called with each
layer's index right after its backward). Gradients are summed over the ranks and scaled by 1/N, so
every rank applies the same update as one solver whose batch is the union of the ranks' batches.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.blob import context
from caffe.parallel.buffers import ParamBuffers
from caffe.parallel.comm import Communicator, ParallelError

log = logging.getLogger("caffe.parallel")


def _solver_net(solver):
    net = getattr(solver, "net", None)
    return net() if callable(net) else net


def _skip(*args) -> None:
    pass


def non_root_solver(solver) -> None:
    """A non-root rank neither tests nor snapshots (Caffe's Step checks Caffe::root_solver()).

    caffe.solver's Step makes the same checks for its test passes and snapshot interval, but a snapshot
    *request* (SIGHUP on any rank, shared with all ranks by synchronize_requests) reaches every rank's
    Snapshot, which refuses to run off the root (as Caffe's CHECKs): on the other ranks it does nothing.
    """
    solver.TestAll = _skip
    solver.Snapshot = _skip


class GradientReducer:
    """Keeps the ranks' parameters identical: broadcast from rank 0, then reduce the gradients each step."""

    def __init__(self, solver, comm: Communicator, xp=np):
        self.solver = solver
        self.comm = comm
        self.xp = xp
        n, r = context.solver_count(), context.solver_rank()
        if (n, r) != (comm.size, comm.rank):
            raise ParallelError(
                f"caffe.solver_count()/solver_rank() are {n}/{r} but this rank is {comm.rank} of {comm.size}: call "
                f"caffe.set_solver_count({comm.size}), caffe.set_solver_rank({comm.rank}) and "
                "caffe.set_multiprocess(True) before building the solver, so that each rank's Data layer reads "
                "its own share of the database")
        self.net = _solver_net(solver)
        self.buffers = ParamBuffers(self.net.learnable_params, xp)
        param = solver.param
        self.iter_size = max(1, int(getattr(param, "iter_size", 1) or 1))
        self._layer_slices = self.buffers.layer_slices(self.net)
        self.layer_wise = bool(getattr(param, "layer_wise_reduce", True))
        if self.layer_wise and self._layer_slices is None:
            # Caffe CHECK-fails here ("Layer-wise reduce is not supported for nets with shared weights");
            # reducing everything once at on_gradients_ready gives the same result
            log.warning("layer_wise_reduce: the net shares weights between layers, so its gradients are reduced "
                        "once per iteration instead of layer by layer")
            self.layer_wise = False
        if self.layer_wise and self.iter_size > 1:
            # with iter_size > 1 each backward would reduce again while the next one accumulates into the
            # same memory; one reduce of the accumulated gradients is the same sum at a fraction of the cost
            log.info("layer_wise_reduce with iter_size %d: gradients are reduced once per iteration",
                     self.iter_size)
            self.layer_wise = False
        if comm.rank != 0:
            non_root_solver(solver)
        self._requests = []
        self._reduced = [False] * len(self.net.layers)
        self._started = 0
        self._action_pending = False

    # -- pycaffe / Caffe surface -------------------------------------------------
    def bcast(self) -> None:
        """Copy rank 0's weights to every rank (at start, and after a restore)."""
        self.buffers.verify()
        self.comm.bcast(self.buffers.data, root=0)

    Broadcast = bcast

    def on_start(self) -> None:
        self.comm.where = f"iteration {getattr(self.solver, 'iter', '?')}"

    def __call__(self, layer: int) -> None:
        """Net callback (after_backward): start reducing layer `layer`'s gradients."""
        self.run(layer)

    def run(self, layer: int) -> None:
        if not self.layer_wise:
            return
        sl = self._layer_slices[layer]
        if sl is None or self._reduced[layer]:
            return
        self._requests.append(self.comm.iallreduce(self.buffers.diff[sl]))
        self._reduced[layer] = True
        if self._requests and hasattr(self.comm, "test"):
            self.comm.test([q for q in self._requests if q is not None])  # let MPI progress meanwhile

    def synchronize_requests(self) -> None:
        """Make every rank act on a stop or snapshot request (SIGINT / SIGHUP) at the same iteration.

        Each rank's solver asks its own signal handler after each update; ranks that disagreed would
        leave one rank stopped and the others waiting for it in the next allreduce. The answers of all
        ranks are combined (one tiny allreduce per iteration): any rank asking to stop stops all, any
        rank asking for a snapshot makes rank 0 write one. A stop asked during rank 0's test pass (which
        the other ranks do not run) is kept for the next update rather than ending the test pass there.
        Every rank must call this, or none.
        """
        from caffe.solver.signals import SolverAction
        solver, xp, comm = self.solver, self.xp, self.comm
        ask = solver.GetRequestedAction
        deferred_stop = [False]

        def GetRequestedAction():
            action = ask()
            if not self._action_pending:  # inside rank 0's test pass: no collective possible here
                if action == SolverAction.STOP and comm.size > 1:
                    deferred_stop[0] = True
                    return SolverAction.NONE
                return action  # a snapshot is rank 0's own business
            self._action_pending = False
            stop = action == SolverAction.STOP or deferred_stop[0]
            deferred_stop[0] = False
            flags = xp.asarray([stop, action == SolverAction.SNAPSHOT], dtype=xp.float32)
            comm.allreduce(flags)
            stop, snap = (float(v) > 0 for v in flags.tolist())
            return SolverAction.STOP if stop else SolverAction.SNAPSHOT if snap else SolverAction.NONE

        solver.GetRequestedAction = GetRequestedAction

    def on_gradients_ready(self) -> None:
        """Solver callback: finish the sum of every gradient, then average."""
        self._action_pending = True  # the solver's next GetRequestedAction is the one after this update
        if self._started == 0:
            self.buffers.verify()  # once: nothing re-allocated a parameter since the buffers were built
        self._started += 1
        diff = self.buffers.diff
        if self.layer_wise:
            self.comm.wait([q for q in self._requests if q is not None])
            # a layer whose callback never ran (net.after_backward(reducer) not registered, or a partial
            # backward) is reduced here: Caffe would silently apply that layer's local gradient
            if not any(self._reduced):
                self.comm.allreduce(diff)
            else:
                for layer, sl in enumerate(self._layer_slices):
                    if sl is not None and not self._reduced[layer]:
                        self.comm.allreduce(diff[sl])
            self._requests.clear()
            self._reduced = [False] * len(self._reduced)
        else:
            self.comm.allreduce(diff)
        if self.comm.size > 1:
            diff *= diff.dtype.type(1.0 / self.comm.size)

    def close(self) -> None:
        self.comm.close()
