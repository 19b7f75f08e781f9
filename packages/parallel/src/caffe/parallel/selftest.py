"""Check that N MPI ranks train exactly like one solver with N times the batch.

    mpiexec -n 2 python -m caffe.parallel.selftest [--batch 2] [--iters 4] [--whole-reduce] ...

Rank 0 writes a tiny LMDB of Datum records and a solver (Data -> InnerProduct -> ReLU ->
InnerProduct -> SoftmaxWithLoss, SGD with momentum and weight decay) into a temporary folder.
Every rank then trains through `caffe.parallel.launch.train_mpi` (the path `mpiexec ... caffe-cli
train` takes), recording its weights at the start of every iteration. Rank 0 finally trains one
solver of batch N*b on the same database from the same initial weights, and checks that:
  - all ranks hold bitwise identical weights at every iteration, and
  - their trajectory matches the single solver's within float32 tolerance.
It prints one JSON line and exits 0 when both hold. Options inject faults and resumption for the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from caffe.layers.python_layer import Layer as PyLayer

FEATURES, HIDDEN, CLASSES = 6, 5, 3

NET = """name: "selftest"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  data_param {{ source: "{db}" backend: LMDB batch_size: {batch} }}
  transform_param {{ scale: 0.0078125 }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
  inner_product_param {{ num_output: {hidden} weight_filler {{ type: "gaussian" std: 0.3 }}
    bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }}
{python}layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param {{ num_output: {classes} weight_filler {{ type: "gaussian" std: 0.3 }}
    bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }}
"""

SOLVER = """net: "{net}"
type: "{type}"
base_lr: 0.2
lr_policy: "step"
gamma: 0.5
stepsize: 3
momentum: {momentum}
weight_decay: {decay}
max_iter: {iters}
display: 0
snapshot: {snapshot}
snapshot_prefix: "{prefix}"
snapshot_after_train: false
random_seed: 7
layer_wise_reduce: {layer_wise}
{test}"""


def write_db(path: str, records: int, seed: int = 3) -> None:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    rng = np.random.default_rng(seed)
    with DBWriter(path, "lmdb") as w:
        for i in range(records):
            x = rng.integers(0, 256, FEATURES, dtype=np.uint8)
            label = int(x[:CLASSES].argmax())  # learnable: the label is where the first features peak
            d = caffe_pb2.Datum(channels=1, height=1, width=FEATURES, data=x.tobytes(), label=label)
            w.put(f"{i:08d}", d.SerializeToString())


PYTHON_LAYER = """layer {{ name: "py" type: "Python" bottom: "ip1" top: "ip1py"
  python_param {{ module: "caffe.parallel.selftest" layer: "IdentityLayer" share_in_parallel: {shared} }} }}
"""


def write_solver(folder: str, tag: str, db: str, batch: int, args, hidden: int = HIDDEN) -> str:
    net = os.path.join(folder, f"net_{tag}.prototxt")
    text = NET.format(db=db, batch=batch, hidden=hidden, classes=CLASSES, python="")
    if getattr(args, "python_layer", "none") != "none":
        py = PYTHON_LAYER.format(shared=str(args.python_layer == "shared").lower())
        text = NET.format(db=db, batch=batch, hidden=hidden, classes=CLASSES, python=py)
        text = text.replace('bottom: "ip1" top: "ip2"', 'bottom: "ip1py" top: "ip2"')
    with open(net, "w") as f:
        f.write(text)
    solver = os.path.join(folder, f"solver_{tag}.prototxt")
    with open(solver, "w") as f:
        f.write(SOLVER.format(net=net, type=args.type, momentum=args.momentum, decay=args.weight_decay,
                              iters=args.iters, snapshot=args.snapshot, prefix=os.path.join(folder, "snap"),
                              layer_wise=str(not args.whole_reduce).lower(),
                              test=(f"test_iter: 1\ntest_interval: {args.test_interval}\n"
                                    if getattr(args, "test_interval", 0) else "")))
    return solver


HANDSHAKE_TAG = 17


class Recorder:
    """A solver callback keeping a copy of the weights at the start of each iteration; injects faults."""

    def __init__(self, solver, rank: int, args, comm=None):
        self.solver, self.rank, self.args, self.comm = solver, rank, args, comm
        self.trajectory: list[np.ndarray] = []
        self.iters: list[int] = []

    def weights(self) -> np.ndarray:
        return np.concatenate([b.cpu_data().ravel().astype(np.float64) for b in self.solver.net.learnable_params])

    def history(self) -> np.ndarray:
        hist = getattr(self.solver, "history", [])
        return np.concatenate([h.cpu_data().ravel().astype(np.float64) for h in hist]) if hist else np.zeros(0)

    def fault_handshake(self, it: int) -> None:
        """Before the fault, every other rank tells the failing rank (point to point) that it has reached the
        fault's iteration, i.e. left the previous iteration's collectives: so what they report names this
        iteration however the machine's load delays them. The watchdog's --timeout applies from here on."""
        mpi, fail = self.comm.comm, self.args.fail_rank
        if self.rank == fail:
            for r in range(self.comm.size):
                if r != fail:
                    mpi.recv(source=r, tag=HANDSHAKE_TAG)
            sys.stderr.write(f"selftest: rank {fail} injects a fault ({self.args.fail_mode}) at iteration {it}\n")
            sys.stderr.flush()
        else:
            mpi.send(it, dest=fail, tag=HANDSHAKE_TAG)
        if self.args.timeout is not None:
            self.comm.set_timeout(self.args.timeout)

    def on_start(self) -> None:
        it = int(self.solver.iter)
        if self.comm is not None and self.args.fail_rank is not None and it == self.args.fail_iter:
            self.fault_handshake(it)
        if self.rank == self.args.fail_rank and it == self.args.fail_iter:
            if self.args.fail_mode == "exit":
                os._exit(1)
            if self.args.fail_mode == "hang":
                time.sleep(600)
            raise RuntimeError(f"injected failure on rank {self.rank}")
        self.iters.append(it)
        self.trajectory.append(self.weights())

    def on_gradients_ready(self) -> None:
        # runs before the reducer's: a rank whose local gradients differ must break the equivalence
        if self.rank == self.args.perturb_rank:
            for b in self.solver.net.learnable_params:
                b.mutable_cpu_diff()[...] *= 2


class IdentityLayer(PyLayer):
    """A Python layer (top = bottom), for the checks of Python layers in multi-rank training."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff


def collect_dropped_databases() -> None:
    """Finalize databases of solvers dropped earlier before the next one opens its own: caffe.layers.db
    takes a non-reentrant lock in open_db, and a garbage collection run inside it that finalizes a dropped
    reader (whose __del__ takes the same lock) deadlocks the process."""
    import gc
    gc.collect()


def single_solver_trajectory(solver_path: str, initial: np.ndarray, restore: str | None, until: int):
    """One solver (solver_count 1) from `initial` weights (or a snapshot); weights at each iteration start."""
    import caffe.solver
    collect_dropped_databases()
    from caffe.blob import context
    context.set_solver_count(1)
    context.set_solver_rank(0)
    context.set_multiprocess(False)
    s = caffe.solver.get_solver(solver_path)
    if restore:
        s.restore(restore)
    else:
        flat = iter(np.split(initial, np.cumsum([b.count() for b in s.net.learnable_params])[:-1]))
        for b in s.net.learnable_params:
            b.data[...] = next(flat).reshape(b.shape)
    rec = Recorder(s, -1, argparse.Namespace(fail_rank=None, fail_iter=None, fail_mode=None, perturb_rank=None))
    s.add_callback(rec)
    s.step(until - int(s.iter))
    return rec.iters + [int(s.iter)], rec.trajectory + [rec.weights()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=2, help="batch per rank")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--records", type=int, default=0, help="database size (default: 2 N b + 1, so it wraps)")
    p.add_argument("--type", default="SGD")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--whole-reduce", action="store_true", help="layer_wise_reduce: false")
    p.add_argument("--snapshot", type=int, default=0, help="snapshot interval; with --resume-from the resume point")
    p.add_argument("--resume-from", type=int, default=0,
                   help="train to this iteration with a snapshot, then resume every rank from it")
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-iter", type=int, default=None)
    p.add_argument("--fail-mode", choices=["raise", "exit", "hang"], default="raise")
    p.add_argument("--skew-rank", type=int, default=None, help="this rank trains a different net (must be refused)")
    p.add_argument("--perturb-rank", type=int, default=None,
                   help="this rank doubles its local gradients (a negative control: must not match)")
    p.add_argument("--signal-rank", type=int, default=None,
                   help="this rank alone requests --signal after the update to --signal-iter")
    p.add_argument("--signal-iter", type=int, default=None)
    p.add_argument("--signal-call", type=int, default=None,
                   help="... or at the solver's Nth call of its action function")
    p.add_argument("--signal", choices=["stop", "snapshot"], default="stop")
    p.add_argument("--test-interval", type=int, default=0, help="rank 0 tests the net (1 batch) this often")
    p.add_argument("--python-layer", choices=["none", "plain", "shared"], default="none",
                   help="add a Python layer (share_in_parallel false / true)")
    p.add_argument("--timeout", type=float, default=None,
                   help="watchdog timeout in seconds; with --fail-rank it applies from --fail-iter on, once every "
                        "rank got there (before: the default), so a start-up slowed by load is not taken for a hang")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=2e-5)
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--workdir", default=None, help="where to make the temporary folder (default: the system's)")
    args = p.parse_args(argv)

    from caffe.parallel.launch import train_mpi
    from caffe.parallel.mpi_comm import MPICommunicator
    timeout = None if args.fail_rank is not None else args.timeout  # armed at the fault's handshake
    comm = MPICommunicator(timeout=timeout)
    rank, n = comm.rank, comm.size
    folder = None
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="caffe-parallel-selftest-", dir=args.workdir)
        db = os.path.join(folder, "train_lmdb")
        write_db(db, args.records or 2 * n * args.batch + 1)
        write_solver(folder, "ranks", db, args.batch, args)
        write_solver(folder, "single", db, n * args.batch, args)
    folder = comm.bcast_object(folder)
    solver_path = os.path.join(folder, "solver_ranks.prototxt")
    if args.skew_rank == rank:
        solver_path = write_solver(folder, f"skew{rank}", os.path.join(folder, "train_lmdb"), args.batch, args,
                                   hidden=HIDDEN + 1)
    recorders = []

    def install(solver):
        rec = Recorder(solver, rank, args, comm)
        solver.add_callback(rec)
        recorders.append(rec)
        if rank == args.signal_rank:  # as if this rank alone got SIGINT (stop) or SIGHUP (snapshot)
            calls = [0]

            def action():
                calls[0] += 1
                if args.signal_call is not None:  # the Nth question (e.g. one from inside a test pass)
                    return args.signal if calls[0] == args.signal_call else "none"
                return args.signal if solver.iter == args.signal_iter else "none"
            solver.SetActionFunction(action)

    snapshot_file = None
    try:
        if args.resume_from:
            # first leg: train to the resume point and snapshot there (rank 0 writes the files)
            first = argparse.Namespace(**{**vars(args), "iters": args.resume_from, "snapshot": args.resume_from})
            if rank == 0:
                write_solver(folder, "first", os.path.join(folder, "train_lmdb"), args.batch, first)
            comm.barrier()
            comm_first = MPICommunicator(timeout=timeout)
            train_mpi(os.path.join(folder, "solver_first.prototxt"), comm=comm_first)
            snapshot_file = os.path.join(folder, f"snap_iter_{args.resume_from}.solverstate")
            recorders.clear()
            collect_dropped_databases()
        s = train_mpi(solver_path, comm=comm, on_solver=install, snapshot=snapshot_file)
        rec = recorders[-1]
        iters = rec.iters + [int(s.iter)]
        traj = rec.trajectory + [rec.weights()]
        # restored momentum must match on every rank too
        hist = rec.history()
        every = comm.allgather_object((iters, [t.tobytes() for t in traj], hist.tobytes()))
        ok = True
        from caffe.parallel.reducer import GradientReducer
        reducer = next(cb for cb in s.callbacks if isinstance(cb, GradientReducer))
        report = {"ranks": n, "batch_per_rank": args.batch, "iters": iters, "layer_wise": reducer.layer_wise,
                  "solver": args.type, "resumed_from": args.resume_from or None}
        identical = all(e[0] == every[0][0] and e[1] == every[0][1] and e[2] == every[0][2] for e in every)
        report["ranks_identical_every_iteration"] = identical
        report["snapshots"] = sorted(f for f in os.listdir(folder) if f.startswith("snap_iter_"))
        ok &= identical
        if rank == 0:
            single_iters, single = single_solver_trajectory(os.path.join(folder, "solver_single.prototxt"),
                                                            traj[0], snapshot_file, iters[-1])
            report["single_iters"] = single_iters
            diffs = [float(np.max(np.abs(a - b))) for a, b in zip(traj, single)]
            report["max_abs_diff_per_iteration"] = diffs
            close = single_iters == iters and all(
                np.allclose(a, b, rtol=args.rtol, atol=args.atol) for a, b in zip(traj, single))
            moved = float(np.max(np.abs(traj[-1] - traj[0])))
            report["weights_moved"] = moved
            report["matches_single_solver"] = close
            ok &= close and moved > 10 * args.atol
            report["ok"] = bool(ok)
            print(json.dumps(report), flush=True)
        return 0 if ok else 1
    finally:
        if rank == 0 and folder and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
