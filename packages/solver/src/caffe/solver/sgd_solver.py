"""SGDSolver: Caffe's sgd_solver.cpp — the update pipeline every typed solver shares.

ApplyUpdate = GetLearningRate, ClipGradients, then per learnable parameter Normalize
(1/iter_size), Regularize (L2 / L1 weight decay times the param's decay_mult) and
ComputeUpdateValue (momentum SGD here; the other solvers override it), then net.Update()
(data -= diff). On the CPU, every solver with L2 decay (or none) runs Regularize, ComputeUpdateValue and
Net.Update in one pass per parameter (caffe-layers' kernels.update, the same bits; see _fused).

The arithmetic runs on whichever array module holds the data (NumPy on CPU, CuPy in GPU
mode), in place, with `out=` and preallocated `update_` / `temp_` blobs as in Caffe, so
an iteration allocates no new arrays. Scalars are cast to the parameter dtype first, so
float32 nets compute in float32 like Caffe's Dtype=float.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from caffe.blob import Blob, context
from caffe.solver.lr_policy import learning_rate
from caffe.solver.params import SolverError
from caffe.solver.registry import register_solver
from caffe.solver.solver import Solver, fmt
from caffe.solver import state_io

log = logging.getLogger("caffe.solver")

try:  # the solvers' fused steps (built with caffe-layers' kernels)
    from caffe.layers.kernels import update as _update
except ImportError:  # pragma: no cover - a source tree without the build
    _update = None
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _net_update():
    from caffe.net import Net
    return Net.Update


@register_solver("SGD")
class SGDSolver(Solver):
    """Stochastic gradient descent with momentum: h = lr * g + momentum * h; w -= h."""

    type = "SGD"

    def __init__(self, param_or_path):
        super().__init__(param_or_path)
        self.PreSolve()

    # -- state -------------------------------------------------------------------------
    def PreSolve(self) -> None:
        params = self.net.learnable_params
        self.history = [Blob(tuple(p.shape), dtype=p.dtype) for p in params]
        self.update = [Blob(tuple(p.shape), dtype=p.dtype) for p in params]
        self.temp = [Blob(tuple(p.shape), dtype=p.dtype) for p in params]
        self._rate = None

    @property
    def dtype(self):
        params = self.net.learnable_params
        return params[0].dtype if len(params) else np.dtype(np.float32)

    @staticmethod
    def _xp():
        return context.array_module()

    def _scalar(self, value, i: int):
        return self.net.learnable_params[i].dtype.type(value)

    # -- learning rate -----------------------------------------------------------------
    def GetLearningRate(self):
        rate, self.current_step = learning_rate(self.param, self.iter, self.current_step, self.dtype,
                                                log_steps=True)
        return rate

    @property
    def lr(self) -> float:
        """The learning rate of the last update (or the one the next update will use, before any)."""
        if self._rate is not None:
            return float(self._rate)
        rate, _ = learning_rate(self.param, self.iter, self.current_step, self.dtype)
        return float(rate)

    # -- the update ----------------------------------------------------------------------
    def ApplyUpdate(self) -> None:
        # every solver of a data-parallel group applies the (all-reduced) update; only the root logs
        rate = self.GetLearningRate()
        self._rate = rate
        if self.param.display and self.iter % self.param.display == 0 and context.root_solver():
            log.info("Iteration %d, lr = %s", self.iter, fmt(rate))
        self.ClipGradients()
        fused = self._fused()
        for i in range(len(self.net.learnable_params)):
            self.Normalize(i)
            if fused:
                self._fused_step(i, rate)
            else:
                self.Regularize(i)
                self.ComputeUpdateValue(i, rate)
        if not fused:
            self.net.Update()

    def _fused(self) -> bool:
        """Whether every parameter takes _fused_step: Regularize, ComputeUpdateValue and Net.Update in one pass
        of caffe-layers' kernels.update, the same bits (its module doc; CaffeNet's SGD update 119 -> 28 ms). It
        needs a solver whose ComputeUpdateValue is the one its _fused_step reproduces (the six solvers' own, not
        one a subclass or the instance replaced, nor a replaced Regularize), L2 decay (or none), the CPU,
        float32 / float64 parameters and history of one dtype each, Net's own Update (not one a subclass or
        the instance replaced: that is then called) and no net debug info (Net.Update logs what it changes);
        otherwise the passes run."""
        params = self.net.learnable_params
        return (_update is not None and context.mode() == context.CPU and not getattr(self.net, "debug_info", False)
                and getattr(self.Regularize, "__func__", None) is SGDSolver.Regularize
                and getattr(self.ComputeUpdateValue, "__func__", None) is type(self)._fused_compute
                and (not self.param.weight_decay or self.param.regularization_type == "L2")
                and getattr(self.net.Update, "__func__", None) is _net_update()
                and all(p.dtype in _FLOATS for p in params)
                and all(h.dtype == params[i % len(params)].dtype for i, h in enumerate(self.history)))

    def _local_decay(self, i: int):
        """weight_decay times the parameter's decay_mult, in its dtype."""
        return self._scalar(self.param.weight_decay, i) * self._scalar(self.net.params_weight_decay[i], i)

    def _flat(self, i: int, histories: int = 1):
        """Parameter i's data, diff and history (`histories` of them: history[i], history[N + i], ...), flat,
        on the host, where the fused steps run."""
        p, n = self.net.learnable_params[i], len(self.net.learnable_params)
        return (p.mutable_cpu_data().reshape(-1), p.mutable_cpu_diff().reshape(-1),
                *(self.history[k * n + i].mutable_cpu_data().reshape(-1) for k in range(histories)))

    def _fused_step(self, i: int, rate) -> None:
        _update.sgd_step(*self._flat(i), self._local_decay(i), self._scalar(self.param.momentum, i),
                         self.local_rate(i, rate))

    def ClipGradients(self) -> None:
        clip = self.param.clip_gradients
        if clip < 0:
            return
        params = self.net.learnable_params
        dt = self.dtype.type
        sumsq = dt(0)
        for p in params:
            sumsq += dt(p.sumsq_diff())
        l2norm = dt(math.sqrt(sumsq))
        if l2norm > clip:
            scale = dt(clip) / l2norm
            log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                     fmt(l2norm), fmt(clip), fmt(scale))
            for p in params:
                p.scale_diff(scale)

    def Normalize(self, i: int) -> None:
        iter_size = self.param.iter_size
        if iter_size == 1:
            return
        xp = self._xp()
        g = self.net.learnable_params[i].mutable_diff_xp(xp)
        dt = g.dtype.type
        xp.multiply(g, dt(1) / dt(iter_size), out=g)

    def Regularize(self, i: int) -> None:
        p = self.net.learnable_params[i]
        local_decay = self._local_decay(i)
        if not local_decay:
            return
        xp = self._xp()
        reg = self.param.regularization_type
        g = p.mutable_diff_xp(xp)
        w = p.data_xp(xp)
        t = self.temp[i].mutable_data_xp(xp)
        if reg == "L2":
            xp.multiply(w, local_decay, out=t)
        elif reg == "L1":
            xp.sign(w, out=t)
            xp.multiply(t, local_decay, out=t)
        else:
            raise SolverError(f"Unknown regularization type: {reg!r} (use L2 or L1)")
        xp.add(g, t, out=g)

    def local_rate(self, i: int, rate):
        return self._scalar(rate, i) * self._scalar(self.net.params_lr[i], i)

    def ComputeUpdateValue(self, i: int, rate) -> None:
        xp = self._xp()
        p = self.net.learnable_params[i]
        momentum = self._scalar(self.param.momentum, i)
        local_rate = self.local_rate(i, rate)
        g = p.mutable_diff_xp(xp)
        h = self.history[i].mutable_data_xp(xp)
        t = self.update[i].mutable_data_xp(xp)
        # h = local_rate * g + momentum * h  (axpby: scale y, then add a*x), then g = h
        xp.multiply(h, momentum, out=h)
        xp.multiply(g, local_rate, out=t)
        xp.add(h, t, out=h)
        xp.copyto(g, h)

    _fused_compute = ComputeUpdateValue  # what _fused_step reproduces

    # -- snapshots of the solver state ---------------------------------------------------
    def SnapshotSolverState(self, model_filename: str) -> str:
        from caffe.proto import caffe_pb2
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            filename = self.SnapshotFilename(".solverstate.h5")
            log.info("Snapshotting solver state to HDF5 file %s", filename)
            state_io.write_state_hdf5(filename, self.iter, model_filename, self.current_step, self.history)
        else:
            filename = self.SnapshotFilename(".solverstate")
            log.info("Snapshotting solver state to binary proto file %s", filename)
            state_io.write_state_binary(filename, self.iter, model_filename, self.current_step, self.history)
        return filename

    def _param_label(self, i: int) -> str:
        """'layer ip1 param 0' for learnable parameter i, when the net says which layer owns it."""
        target = self.net.learnable_params[i]
        params = getattr(self.net, "params", None)
        if params is not None:
            for layer_name, blobs in params.items():
                for j, b in enumerate(blobs):
                    if b is target:
                        return f"learnable param {i} (layer {layer_name!r} param {j})"
        return f"learnable param {i}"

    def _history_target_shape(self, i: int):
        return tuple(self.history[i].shape)

    def _check_history(self, shapes, state_file: str) -> None:
        """A state from another net (or another solver type) fails here, before anything is changed."""
        n_params = len(self.net.learnable_params)
        if len(shapes) != len(self.history):
            sets = len(self.history) // n_params if n_params else 1
            raise SolverError(
                f"solver state {state_file!r}: incorrect length of history blobs: the file holds {len(shapes)}, "
                f"this {self.type} solver needs {len(self.history)} ({sets} per learnable parameter x "
                f"{n_params} learnable parameters of net {getattr(self.net, 'name', '')!r}); the state was "
                f"written for a different net or solver type")
        for i, shape in enumerate(shapes):
            want = self._history_target_shape(i)
            if _strip_ones(shape) != _strip_ones(want):  # legacy 4-d shapes pad with leading 1s
                raise SolverError(
                    f"solver state {state_file!r}: history blob {i} has shape {tuple(shape)} but "
                    f"{self._param_label(i % n_params)} has shape {want}; the state was written for a "
                    f"different net")

    def RestoreSolverStateFromBinaryProto(self, state_file: str) -> None:
        from caffe.blob.proto_io import blob_proto_shape
        state = state_io.read_state_binary(state_file)
        self._check_history([tuple(blob_proto_shape(h)) for h in state.history], state_file)
        self.iter = state.iter
        if state.HasField("learned_net") and state.learned_net:
            self._load_learned_net(state.learned_net, state_file)
        self.current_step = state.current_step
        log.info("SGDSolver: restoring history")
        for blob, proto in zip(self.history, state.history):
            shape = blob.shape
            blob.from_proto(proto, reshape=True)
            if blob.shape != shape:  # legacy 4-d shapes: keep the parameter's own shape
                blob.reshape(shape)

    def RestoreSolverStateFromHDF5(self, state_file: str) -> None:
        iter_, learned_net, current_step, history = state_io.read_state_hdf5(state_file)
        self._check_history([a.shape for a in history], state_file)
        self.iter = iter_
        if learned_net:
            self._load_learned_net(learned_net, state_file)
        self.current_step = current_step
        for blob, arr in zip(self.history, history):
            blob.mutable_cpu_data()[...] = arr.reshape(blob.shape)


def _strip_ones(shape) -> tuple:
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape
