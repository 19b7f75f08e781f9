"""Solver: Caffe's solver.cpp — nets, the training loop, testing, snapshots, restore.

The loop is Caffe's Step(), in Caffe's order: clear the parameter diffs; test every
`test_interval` iterations; callbacks' on_start; ForwardBackward `iter_size` times
(losses summed, then divided); smoothed loss over `average_loss` iterations; display;
callbacks' on_gradients_ready; ApplyUpdate (the typed solver's); iter += 1; snapshot on
schedule or on request; stop on request. Solve() wraps Step() with restore, the
after-training snapshot, and a last display/test pass.

One deliberate addition: a non-finite training loss stops training with a
NonFiniteLossError naming the iteration, before the update touches the weights and
without writing any snapshot, so the last good snapshot stays the newest.

GPU mode keeps the device busy: the loss of each iteration stays on the device (a
caffe.blob.deferred.DeviceScalar) until the solver needs it: at display iterations, before
a snapshot, when `losses` / `smoothed_loss` are read, and at least every LOSS_READ_EVERY
iterations. Then all the losses waiting are read in one copy and folded into the smoothed
loss in iteration order, so the displayed numbers are exactly those of reading every loss
at once (CPU mode reads it at once, as before). The non-finite check then runs on those
losses: in GPU mode training stops at the read, naming the first iteration whose loss was
not finite; the updates of the iterations between it and the read have been applied (the
snapshot is still not written).

Two more: a training holds a lock on its snapshot_prefix (caffe.solver.snapshot_lock),
so a second training on the same prefix fails with a clear error instead of silently
overwriting the first one's snapshots (unless `overwrite_snapshots` is set); and
snapshots are written atomically (caffe.blob.fileio), the weights streamed straight to
one temporary file (Net.Save / Net.ToHDF5), a full disk reported with the file's name.

Log lines keep glog's text (logger "caffe.solver", a child of "caffe") so log-parsing
scripts written for Caffe keep working.
"""
from __future__ import annotations

import logging
import math
import os
import time

import numpy as np

from caffe.blob import deferred
from caffe.blob.deferred import DeviceScalar
from caffe.proto import caffe_pb2
from caffe.solver.params import SolverError, read_net_params, read_solver_params, upgrade_solver_as_needed
from caffe.solver.signals import SolverAction

log = logging.getLogger("caffe.solver")

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


# GPU mode: read the losses waiting on the device at least this often (also at display iterations and snapshots).
LOSS_READ_EVERY = 100


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; training stopped before that iteration's update."""


def fmt(value) -> str:
    """A number as C++'s `ostream << float` prints it (precision 6, %g)."""
    v = float(value)
    if math.isnan(v):
        return "nan" if math.copysign(1.0, v) > 0 else "-nan"
    return format(v, "g")


class _FunctionCallback:
    """pycaffe's SolverCallback: two callables (either may be None)."""

    def __init__(self, on_start, on_gradients_ready):
        self._on_start = on_start
        self._on_gradients_ready = on_gradients_ready

    def on_start(self):
        if self._on_start is not None:
            self._on_start()

    def on_gradients_ready(self):
        if self._on_gradients_ready is not None:
            self._on_gradients_ready()


class Solver:
    """Base class of the typed solvers. `Solver(path_or_param)` builds the solver its `type` names."""

    type = None  # the registered type name of a concrete solver class

    def __new__(cls, param_or_path=None, *args, **kwargs):
        if cls is Solver and param_or_path is not None:
            from caffe.solver.registry import solver_class
            param = _load_param(param_or_path)
            obj = object.__new__(solver_class(param.type))
            obj._preloaded_param = param
            return obj
        return object.__new__(cls)

    def __init__(self, param_or_path):
        param = self.__dict__.pop("_preloaded_param", None)
        if param is None:
            param = _load_param(param_or_path)
        self._source = os.fspath(param_or_path) if isinstance(param_or_path, (str, os.PathLike)) else None
        self.net = None
        self.test_nets = []
        self.callbacks = []
        self.requested_early_exit = False
        self._action_function = None
        self._losses: list[float] = []
        self._smoothed_loss = 0.0
        self._pending_losses: list = []  # GPU mode: [(iteration, loss on the device, counts for smoothing)]
        self._smoothing = (0, 1)  # (start_iter, average_loss) of the Step the smoothed loss belongs to
        self.mean_scores: list[list[float]] = []
        self.mean_scores_iter: list[int | None] = []  # the iteration each test net's mean_scores are from
        self.last_snapshot: tuple[str, str] | None = None
        self._iterations_last = 0
        self._output_cache = {}
        self.overwrite_snapshots = False  # True: write snapshot_prefix even while another training holds it
        self._prefix_locked: str | None = None
        self.Init(param)

    # -- construction ---------------------------------------------------------------
    def Init(self, param) -> None:
        log.info("Initializing solver from parameters: \n%s", param)
        self.param = param
        if param.average_loss < 1:
            raise SolverError(f"average_loss should be >= 1, got {param.average_loss}")
        if param.iter_size < 1:
            raise SolverError(f"iter_size should be >= 1, got {param.iter_size}")
        if param.max_iter < 0:
            raise SolverError(f"{self._where()}: max_iter is {param.max_iter}; it must be >= 0 (the number of "
                              f"iterations to train)")
        self.check_param(param)
        self.CheckSnapshotWritePermissions()
        from caffe.blob import context
        if param.random_seed >= 0:
            context.set_random_seed(param.random_seed + context.solver_rank())
        self.InitTrainNet()
        self.InitTestNets()
        log.info("Solver scaffolding done.")
        self.iter = 0
        self.current_step = 0

    def check_param(self, param) -> None:
        """Typed solvers check their hyperparameters here (before any net is built)."""

    def _where(self) -> str:
        return f"solver {self._source!r}" if self._source else "SolverParameter"

    def InitTrainNet(self) -> None:
        p = self.param
        fields = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.HasField(f)]
        names = "net, net_param, train_net, train_net_param"
        if not fields:
            raise SolverError(f"{self._where()} must specify a train net using one of these fields: {names}")
        if len(fields) > 1:
            raise SolverError(f"{self._where()} must not contain more than one of these fields specifying a "
                              f"train_net: {names} (it has {', '.join(fields)})")
        net_param = caffe_pb2.NetParameter()
        if p.HasField("train_net_param"):
            log.info("Creating training net specified in train_net_param.")
            net_param.CopyFrom(p.train_net_param)
        elif p.HasField("train_net"):
            log.info("Creating training net from train_net file: %s", p.train_net)
            net_param.CopyFrom(read_net_params(p.train_net, "train_net", self._source))
        if p.HasField("net_param"):
            log.info("Creating training net specified in net_param.")
            net_param.CopyFrom(p.net_param)
        if p.HasField("net"):
            log.info("Creating training net from net file: %s", p.net)
            net_param.CopyFrom(read_net_params(p.net, "net", self._source))
        # NetState precedence: solver default (TRAIN) < the net's own state < train_state
        state = caffe_pb2.NetState()
        state.phase = TRAIN
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        self.net = _make_net(net_param)
        for model_list in p.weights:
            self._load_weights(self.net, model_list)

    def InitTestNets(self) -> None:
        p = self.param
        has_net_param, has_net_file = p.HasField("net_param"), p.HasField("net")
        if has_net_param and has_net_file:
            raise SolverError(f"{self._where()}: both net_param and net may not be specified")
        num_generic = int(has_net_param) + int(has_net_file)
        num_test_nets = len(p.test_net_param) + len(p.test_net)
        n_iter = len(p.test_iter)
        if (num_generic and n_iter < num_test_nets) or (not num_generic and n_iter != num_test_nets):
            raise SolverError(
                f"{self._where()}: test_iter must be specified for each test network: {n_iter} test_iter for "
                f"{num_test_nets} test_net/test_net_param" +
                ("" if num_generic else " (with no generic net/net_param, the counts must be equal)"))
        num_instances = n_iter if num_generic else num_test_nets
        if len(p.test_state) and len(p.test_state) != num_instances:
            raise SolverError(f"{self._where()}: test_state must be unspecified or specified once per test net "
                              f"({len(p.test_state)} test_state for {num_instances} test nets)")
        if num_instances and p.test_interval <= 0:
            raise SolverError(f"{self._where()}: test nets are defined ({num_instances}) but test_interval is "
                              f"{p.test_interval}; it must be > 0")
        sources, params = [], []
        for tp in p.test_net_param:
            sources.append("test_net_param")
            params.append(_copy(tp))
        for path in p.test_net:
            sources.append("test_net file: " + path)
            params.append(read_net_params(path, "test_net", self._source))
        remaining = n_iter - len(params)
        if has_net_param:
            for _ in range(remaining):
                sources.append("net_param")
                params.append(_copy(p.net_param))
        if has_net_file:
            for _ in range(remaining):
                sources.append("net file: " + p.net)
                params.append(read_net_params(p.net, "net", self._source))
        self.test_nets = []
        for i, net_param in enumerate(params):
            state = caffe_pb2.NetState()
            state.phase = TEST
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net_param.state.CopyFrom(state)
            log.info("Creating test net (#%d) specified by %s", i, sources[i])
            net = _make_net(net_param)
            _set_debug_info(net, p.debug_info)
            for model_list in p.weights:
                self._load_weights(net, model_list)
            self.test_nets.append(net)
        self.mean_scores = [[] for _ in self.test_nets]
        self.mean_scores_iter = [None for _ in self.test_nets]

    def _load_weights(self, net, model_list: str) -> None:
        for name in model_list.split(","):
            name = name.strip()
            if not name:
                continue
            if not os.path.exists(name):
                raise SolverError(f"{self._where()}: weights file {name!r} not found "
                                  f"(relative to the current directory {os.getcwd()!r})")
            log.info("Finetuning from %s", name)
            net.CopyTrainedLayersFrom(name)

    # -- pycaffe surface ---------------------------------------------------------------
    @property
    def solver_params(self):
        return self.param

    def add_callback(self, on_start, on_gradients_ready=None) -> None:
        """pycaffe: add_callback(on_start, on_gradients_ready), or add_callback(obj) for an object with
        on_start() and on_gradients_ready() methods (NCCL)."""
        if on_gradients_ready is None and hasattr(on_start, "on_gradients_ready"):
            self.callbacks.append(on_start)
        else:
            self.callbacks.append(_FunctionCallback(on_start, on_gradients_ready))

    def SetActionFunction(self, fn) -> None:
        """fn() -> SolverAction (or 'stop' / 'snapshot' / 'none'), asked each iteration and test batch."""
        self._action_function = fn

    set_action_function = SetActionFunction

    def GetRequestedAction(self) -> SolverAction:
        if self._action_function is None:
            return SolverAction.NONE
        from caffe.solver.signals import action_from_string
        return action_from_string(self._action_function())

    def share_weights(self, net) -> None:
        """pycaffe: make `net` share the train net's trained layers."""
        net.ShareTrainedLayersWith(self.net)

    def step(self, iters: int) -> None:
        self.Step(iters)

    def solve(self, resume=None) -> None:
        self.Solve(resume)

    def restore(self, state_file) -> None:
        self.Restore(state_file)

    def snapshot(self) -> None:
        self.Snapshot()

    def apply_update(self) -> None:
        self.ApplyUpdate()

    # -- the training loop -------------------------------------------------------------
    def Step(self, iters: int) -> None:
        p = self.param
        start_iter = self.iter
        stop_iter = self.iter + int(iters)
        average_loss = p.average_loss
        iter_size = p.iter_size
        # losses of an earlier Step still on the device are checked at the next read, not smoothed
        self._pending_losses = [(it, value, False) for it, value, _ in self._pending_losses]
        self._losses = []
        self._smoothed_loss = 0.0
        self._smoothing = (start_iter, average_loss)
        self._iterations_last = self.iter
        timer = time.perf_counter()
        net = self.net
        from caffe.blob import context
        root = context.root_solver()
        while self.iter < stop_iter:
            net.ClearParamDiffs()
            if (p.test_interval and self.iter % p.test_interval == 0
                    and (self.iter > 0 or p.test_initialization)):
                if root:
                    self.TestAll()
                if self.requested_early_exit:
                    break  # stop was requested while testing
            for cb in self.callbacks:
                cb.on_start()
            display = bool(p.display) and self.iter % p.display == 0
            _set_debug_info(net, display and p.debug_info)
            loss = 0.0
            for _ in range(iter_size):
                loss += _as_loss(net.ForwardBackward())
            loss /= iter_size
            if isinstance(loss, DeviceScalar) and loss.pending:  # GPU mode: read when needed (see the doc)
                self._pending_losses.append((self.iter, loss, True))
                if (display and root) or len(self._pending_losses) >= LOSS_READ_EVERY:
                    self._read_losses()
            else:
                self._read_losses()
                loss = float(loss)
                if not math.isfinite(loss):
                    self._nonfinite(loss)
                self.UpdateSmoothedLoss(loss, start_iter, average_loss)
            if display and root:
                lapse = time.perf_counter() - timer
                per_s = (self.iter - self._iterations_last) / (lapse if lapse else 1.0)
                log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, fmt(per_s), fmt(lapse),
                         p.display, fmt(self.smoothed_loss))
                timer = time.perf_counter()
                self._iterations_last = self.iter
                self._log_train_outputs(net)
            for cb in self.callbacks:
                cb.on_gradients_ready()
            self.ApplyUpdate()
            # iter counts the updates applied so far
            self.iter += 1
            request = self.GetRequestedAction()
            if (p.snapshot and self.iter % p.snapshot == 0 and root) or request == SolverAction.SNAPSHOT:
                self.Snapshot()
            if request == SolverAction.STOP:
                self.requested_early_exit = True
                break

    def _nonfinite(self, loss: float, at: int | None = None) -> None:
        kept = (f"the last snapshot ({self.last_snapshot[0]}, {self.last_snapshot[1]}) is left as it was"
                if self.last_snapshot else "no snapshot was written")
        if at is None or at == self.iter:
            msg = (f"Iteration {self.iter}: the training loss is {fmt(loss)}; training stopped before this "
                   f"iteration's update (weights are those after iteration {self.iter - 1 if self.iter else 0} "
                   f"updates), {kept}. Lower base_lr, set clip_gradients, or check the data.")
        else:
            msg = (f"Iteration {at}: the training loss is {fmt(loss)}; found when the losses kept on the GPU were "
                   f"read at iteration {self.iter}: training stopped there (the weights carry the updates of "
                   f"iterations {at} to {self.iter - 1}), {kept}. Lower base_lr, set clip_gradients, or check "
                   f"the data.")
        log.error(msg)
        raise NonFiniteLossError(msg)

    def _read_losses(self) -> None:
        """Read the losses waiting on the device (one copy) and fold them in, in iteration order."""
        pending = self._pending_losses
        if not pending:
            return
        self._pending_losses = []
        start_iter, average_loss = self._smoothing
        for (it, _, smooth), value in zip(pending, deferred.values([v for _, v, _ in pending])):
            if not math.isfinite(value):
                self._nonfinite(value, at=it)
            if smooth:
                self._update_smoothed(value, it, start_iter, average_loss)

    @property
    def losses(self) -> list[float]:
        """The last `average_loss` training losses (Caffe's losses_; reads those still on the device)."""
        self._read_losses()
        return self._losses

    @losses.setter
    def losses(self, value) -> None:
        self._read_losses()
        self._losses = value

    @property
    def smoothed_loss(self) -> float:
        """The training loss averaged over the last `average_loss` iterations (reads those on the device)."""
        self._read_losses()
        return self._smoothed_loss

    @smoothed_loss.setter
    def smoothed_loss(self, value) -> None:
        self._read_losses()
        self._smoothed_loss = value

    def Solve(self, resume_file=None) -> None:
        from caffe.blob import context
        if not context.root_solver():
            raise SolverError("Solve must be called on the root solver")
        log.info("Solving %s", getattr(self.net, "name", ""))
        log.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        locked_here = self._lock_snapshot_prefix()
        try:
            self._solve(resume_file)
        finally:
            if locked_here:
                self.release_snapshot_prefix()

    def _solve(self, resume_file) -> None:
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.Restore(resume_file)
        p = self.param
        if self.iter > p.max_iter:
            log.warning("The solver state is at iteration %d, past max_iter %d: nothing to train", self.iter,
                        p.max_iter)
        start_iter = self.iter
        self.Step(p.max_iter - self.iter)
        # the after-training snapshot, unless the schedule has just written one
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.Snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        # a last forward pass (no update) to display the final loss, and a last test
        if p.display and self.iter % p.display == 0:
            self._read_losses()
            loss = float(_as_loss(self.net.Forward()))
            self.UpdateSmoothedLoss(loss, start_iter, p.average_loss)
            log.info("Iteration %d, loss = %s", self.iter, fmt(self.smoothed_loss))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.TestAll()
        log.info("Optimization Done.")

    def UpdateSmoothedLoss(self, loss: float, start_iter: int, average_loss: int) -> None:
        self._read_losses()
        self._update_smoothed(float(loss), self.iter, start_iter, average_loss)

    def _update_smoothed(self, loss: float, it: int, start_iter: int, average_loss: int) -> None:
        losses = self._losses
        if len(losses) < average_loss:
            losses.append(loss)
            size = len(losses)
            self._smoothed_loss = (self._smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (it - start_iter) % average_loss
            self._smoothed_loss += (loss - losses[idx]) / average_loss
            losses[idx] = loss

    # -- testing --------------------------------------------------------------------------
    def TestAll(self) -> None:
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.Test(i)

    def Test(self, test_net_id: int = 0) -> None:
        p = self.param
        log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        test_net = self.test_nets[test_net_id]
        test_net.ShareTrainedLayersWith(self.net)
        n_iter = p.test_iter[test_net_id]
        scores = None
        loss = 0.0
        for i in range(n_iter):
            request = self.GetRequestedAction()
            while request != SolverAction.NONE:
                if request == SolverAction.SNAPSHOT:
                    self.Snapshot()
                elif request == SolverAction.STOP:
                    self.requested_early_exit = True
                request = self.GetRequestedAction()
            if self.requested_early_exit:
                break
            iter_loss = float(_as_loss(test_net.Forward()))
            deferred.flush()  # device-side checks (labels) of the test net: its outputs are read below anyway
            if p.test_compute_loss:
                loss += iter_loss
            outputs = self._outputs(test_net)
            values = [np.asarray(b.cpu_data()).ravel() for b, _, _ in outputs]
            if scores is None:
                dtype = values[0].dtype if values else np.float32
                scores = np.concatenate(values).astype(dtype) if values else np.zeros(0, np.float32)
            elif values:
                scores += np.concatenate(values)
        if self.requested_early_exit:
            log.info("Test interrupted.")
            return
        if p.test_compute_loss:
            loss = loss / n_iter if n_iter else float("nan")
            log.info("Test loss: %s", fmt(loss))
        means = []
        if scores is not None:
            dt = scores.dtype.type
            k = 0
            for blob, name, weight in self._outputs(test_net):
                for _ in range(blob.count()):
                    mean = dt(scores[k] / dt(n_iter))
                    means.append(float(mean))
                    extra = f" (* {fmt(weight)} = {fmt(dt(weight) * mean)} loss)" if weight else ""
                    log.info("    Test net output #%d: %s = %s%s", k, name, fmt(mean), extra)
                    k += 1
        self.mean_scores[test_net_id] = means
        self.mean_scores_iter[test_net_id] = self.iter

    def _outputs(self, net):
        """[(blob, name, loss_weight)] for the net's outputs (fixed once the net is built)."""
        cached = self._output_cache.get(id(net))
        if cached is not None and cached[0] is net:
            return cached[1]
        names = list(net.output_blob_names)
        blobs = list(net.output_blobs)
        weights_src = getattr(net, "blob_loss_weights", None)
        indices = getattr(net, "output_blob_indices", None)
        blob_names = list(getattr(net, "blob_names", []) or [])
        out = []
        for j, (blob, name) in enumerate(zip(blobs, names)):
            w = 0.0
            if isinstance(weights_src, dict):
                w = weights_src.get(name, 0.0)
            elif weights_src is not None:
                idx = indices[j] if indices is not None else (blob_names.index(name) if name in blob_names
                                                              else None)
                if idx is not None and idx < len(weights_src):
                    w = weights_src[idx]
            out.append((blob, name, float(w)))
        self._output_cache[id(net)] = (net, out)
        return out

    def _log_train_outputs(self, net) -> None:
        k = 0
        for blob, name, weight in self._outputs(net):
            data = np.asarray(blob.cpu_data()).ravel()
            dt = data.dtype.type
            for v in data:
                extra = f" (* {fmt(weight)} = {fmt(dt(weight) * v)} loss)" if weight else ""
                log.info("    Train net output #%d: %s = %s%s", k, name, fmt(v), extra)
                k += 1

    # -- snapshots -----------------------------------------------------------------------
    def CheckSnapshotWritePermissions(self) -> None:
        from caffe.blob import context
        p = self.param
        if context.root_solver() and p.snapshot:
            if not p.HasField("snapshot_prefix"):
                raise SolverError(f"{self._where()}: snapshot is specified but snapshot_prefix is not")
            probe = self.SnapshotFilename(".tempfile", iter_=0)
            try:
                with open(probe, "w"):
                    pass
                os.remove(probe)
            except OSError:
                raise SolverError(f"Cannot write to snapshot prefix '{p.snapshot_prefix}'.  Make sure that the "
                                  f"directory exists and is writable.") from None

    def _lock_snapshot_prefix(self) -> bool:
        """Hold the lock of snapshot_prefix (root solver); True when this call took it."""
        from caffe.blob import context
        from caffe.solver import snapshot_lock
        prefix = self.param.snapshot_prefix
        if self._prefix_locked is not None or not prefix or not context.root_solver():
            return False
        if self.overwrite_snapshots:
            other = snapshot_lock.held_by_other(prefix)
            if other:
                log.warning("snapshot_prefix %s is in use by another training (%s); writing there anyway "
                            "(overwrite_snapshots)", prefix, other)
            return False
        snapshot_lock.acquire(prefix)
        self._prefix_locked = prefix
        return True

    def release_snapshot_prefix(self) -> None:
        """Let another training use this solver's snapshot_prefix (done at the end of Solve)."""
        if self._prefix_locked is not None:
            from caffe.solver import snapshot_lock
            snapshot_lock.release(self._prefix_locked)
            self._prefix_locked = None

    def __del__(self):
        try:
            self.release_snapshot_prefix()
        except Exception:
            pass

    def SnapshotFilename(self, extension: str, iter_: int | None = None) -> str:
        it = self.iter if iter_ is None else iter_
        return f"{self.param.snapshot_prefix}_iter_{it}{extension}"

    def Snapshot(self) -> None:
        from caffe.blob import context
        if not context.root_solver():
            raise SolverError("Snapshot must be called on the root solver")
        self._lock_snapshot_prefix()  # a solver driven by step(): from its first snapshot on
        self._read_losses()  # GPU mode: a non-finite loss still on the device stops before the snapshot
        fmt_ = self.param.snapshot_format
        if fmt_ == caffe_pb2.SolverParameter.BINARYPROTO:
            model_filename = self.SnapshotToBinaryProto()
        elif fmt_ == caffe_pb2.SolverParameter.HDF5:
            model_filename = self.SnapshotToHDF5()
        else:
            raise SolverError(f"Unsupported snapshot format: {fmt_}")
        state_filename = self.SnapshotSolverState(model_filename)
        self.last_snapshot = (model_filename, state_filename)

    def SnapshotToBinaryProto(self) -> str:
        model_filename = self.SnapshotFilename(".caffemodel")
        log.info("Snapshotting to binary proto file %s", model_filename)
        self.net.Save(model_filename, write_diff=self.param.snapshot_diff)  # streamed, atomic
        return model_filename

    def SnapshotToHDF5(self) -> str:
        model_filename = self.SnapshotFilename(".caffemodel.h5")
        log.info("Snapshotting to HDF5 file %s", model_filename)
        self.net.ToHDF5(model_filename, write_diff=self.param.snapshot_diff)  # one temporary file, atomic
        return model_filename

    def Restore(self, state_file) -> None:
        state_file = os.fspath(state_file)
        if state_file.endswith(".h5"):
            self.RestoreSolverStateFromHDF5(state_file)
        else:
            self.RestoreSolverStateFromBinaryProto(state_file)

    def _load_learned_net(self, learned_net: str, state_file: str) -> None:
        """Caffe opens learned_net relative to the current directory; when it is not there, the
        same name next to the state file is used (the usual case of a moved snapshot pair)."""
        path = learned_net
        if not os.path.exists(path) and not os.path.isabs(path):
            beside = os.path.join(os.path.dirname(state_file), os.path.basename(learned_net))
            if os.path.exists(beside):
                path = beside
        if not os.path.exists(path):
            raise SolverError(f"solver state {state_file!r} names learned_net {learned_net!r}, which was not "
                              f"found (relative to {os.getcwd()!r} or next to the state file)")
        self.net.CopyTrainedLayersFrom(path)

    # -- implemented by the typed solvers -----------------------------------------------
    def ApplyUpdate(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} implements no ApplyUpdate")

    def SnapshotSolverState(self, model_filename: str) -> str:
        raise NotImplementedError

    def RestoreSolverStateFromBinaryProto(self, state_file: str) -> None:
        raise NotImplementedError

    def RestoreSolverStateFromHDF5(self, state_file: str) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} iter={getattr(self, 'iter', 0)} net={getattr(self.net, 'name', '')!r}>"


# -- helpers -------------------------------------------------------------------------------

def _load_param(param_or_path):
    if isinstance(param_or_path, caffe_pb2.SolverParameter):
        param = caffe_pb2.SolverParameter()
        param.CopyFrom(param_or_path)
        upgrade_solver_as_needed(param)
        return param
    if isinstance(param_or_path, (str, os.PathLike)):
        return read_solver_params(param_or_path)
    raise TypeError(f"a solver needs a SolverParameter or the path of a solver prototxt, "
                    f"got {type(param_or_path).__name__}")


def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def _make_net(net_param):
    from caffe.net import Net
    return Net(net_param)


def _set_debug_info(net, flag: bool) -> None:
    fn = getattr(net, "set_debug_info", None)
    if fn is not None:
        fn(bool(flag))


def _as_loss(value):
    """Net.Forward/ForwardBackward return the loss (a number, or in GPU mode a DeviceScalar, kept as it is);
    accept (outputs, loss) pairs too."""
    if isinstance(value, tuple):
        value = value[-1]
    return value if isinstance(value, DeviceScalar) else float(value)


__all__ = ["Solver", "SolverError", "NonFiniteLossError", "fmt"]
