"""Launching data-parallel training: one process per GPU (spawned), or one per MPI rank (mpiexec).

- `train_multi_gpu(solver, gpus)`: what `caffe-cli train --gpu=0,1` runs, as Caffe's python/train.py:
  one spawned process per GPU, joined by an NCCL unique id created here.
- `train_mpi(solver)`: what `mpiexec -n N caffe-cli train --solver=...` runs in each rank, on CPUs
  (MPI reduces the gradients) or with one GPU per local rank (NCCL, its unique id sent over MPI).
- `mpi_world()`: (rank, size, local_rank) under mpiexec with more than one rank, else None.

Every rank builds the same solver with solver_count/solver_rank set first (so each Data layer reads
its own share), restores the snapshot if any, takes rank 0's weights, and steps; only rank 0 tests,
prints and snapshots. A rank that fails stops the others with a message naming it.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback

from caffe.blob import context
from caffe.parallel import checks
from caffe.parallel._extras import require_mpi
from caffe.parallel.comm import ParallelError

log = logging.getLogger("caffe.parallel")

# environment variables by which MPI launchers tell a process its place in the job
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_WORLD_SIZE")


class CollectiveError(ParallelError):
    """A start-up check that every rank evaluates alike (so every rank raises it; nobody is left waiting)."""


# --------------------------------------------------------------------------------------------- MPI world

def _launcher_size() -> int | None:
    for var in _SIZE_VARS:
        raw = os.environ.get(var)
        if raw:
            try:
                return int(raw)
            except ValueError:
                continue
    return None


def mpi_world() -> tuple[int, int, int] | None:
    """(rank, size, local_rank) when this process is one of several MPI ranks, else None.

    Decided from the launcher's environment (PMI_SIZE, OMPI_COMM_WORLD_SIZE, ...) without importing
    mpi4py, so a plain run never initializes MPI; under mpiexec a missing mpi4py is an error that
    names the `mpi` extra (the ranks would otherwise each train alone, on the whole database).
    """
    size = _launcher_size()
    if size is None:
        mpi = sys.modules.get("mpi4py.MPI")  # a user script that already initialized MPI
        if mpi is None or not mpi.Is_initialized() or mpi.COMM_WORLD.Get_size() <= 1:
            return None
    elif size <= 1:
        return None
    MPI = require_mpi(f"this process was started by mpiexec as one of {size} ranks, and training them together")
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        return world.Get_rank(), world.Get_size(), local.Get_rank()
    finally:
        local.Free()


# --------------------------------------------------------------------------------------------- GPUs

def _spec_text(spec) -> str:
    if isinstance(spec, (str, int)):
        return str(spec)
    return ",".join(map(str, spec))


def parse_gpu_list(spec, count: int) -> list[int]:
    """GPU ids from `--gpu` ("0,1", "all", an int or a list), checked against `count` visible GPUs."""
    flag = f"--gpu={_spec_text(spec)}"
    if count <= 0:
        context.require_gpu(flag)  # raises NoGPUError with the reason
        raise context.NoGPUError(f"{flag}: no GPU is visible")
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() == "all":
            return list(range(count))
        try:
            ids = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"{flag}: expected GPU ids separated by commas (e.g. --gpu=0,1) or 'all'") from None
    elif isinstance(spec, int):
        ids = [spec]
    else:
        ids = [int(g) for g in spec]
    if not ids:
        raise ValueError(f"{flag}: no GPU id given")
    for g in ids:
        if g < 0:
            raise ValueError(f"{flag}: GPU ids are >= 0, got {g}")
        if g >= count:
            raise context.NoGPUError(f"{flag}: GPU {g} does not exist ({count} GPU(s) visible: ids 0..{count - 1})")
    seen = set()
    for g in ids:
        if g in seen:
            raise ValueError(f"{flag}: GPU {g} is listed twice; each rank needs a GPU of its own")
        seen.add(g)
    return ids


def select_gpus(spec) -> list[int]:
    """parse_gpu_list against this machine's GPUs; NoGPUError when there is none."""
    context.require_gpu(f"--gpu={_spec_text(spec)}")
    return parse_gpu_list(spec, context.gpu_count())


# --------------------------------------------------------------------------------------------- one rank

def _solver_source(solver):
    """What get_solver takes: a path (kept, so snapshot_prefix defaults from the file name as in Caffe),
    or a SolverParameter (also given as its serialized bytes, as spawned ranks receive it)."""
    from caffe.proto import caffe_pb2
    if isinstance(solver, caffe_pb2.SolverParameter):
        return solver
    if isinstance(solver, bytes):
        param = caffe_pb2.SolverParameter()
        param.ParseFromString(solver)
        return param
    return os.fspath(solver)


def _call(obj, names, *args):
    for name in names:
        fn = getattr(obj, name, None)
        if callable(fn):
            return fn(*args)
    raise AttributeError(f"{type(obj).__name__} has none of {names}")


def _solver_net(solver):
    net = solver.net
    return net() if callable(net) else net


def build_rank_solver(solver, rank: int, size: int, *, weights=None, snapshot=None, on_solver=None):
    """Set the rank's coordinates, then build its solver, load weights / restore the snapshot."""
    context.set_solver_count(size)
    context.set_solver_rank(rank)
    context.set_multiprocess(size > 1)
    from caffe.solver import get_solver
    s = get_solver(_solver_source(solver))
    if on_solver is not None:
        on_solver(s)
    if weights:
        # Caffe's CopyLayers: comma-separated caffemodels into the train net (and the test nets)
        nets = [_solver_net(s)] + list(getattr(s, "test_nets", []) or [])
        for path in str(weights).split(","):
            for net in nets:
                net.CopyTrainedLayersFrom(path.strip())
    if snapshot:
        _call(s, ("Restore", "restore"), os.fspath(snapshot))  # every rank restores (history included)
    return s


def run_rank(solver, reducer, rank: int) -> None:
    """Broadcast rank 0's weights, hook the reducer in, and train up to max_iter (Caffe's NCCL::Run)."""
    reducer.bcast()
    reducer.synchronize_requests()
    solver.add_callback(reducer)
    if reducer.layer_wise:
        _solver_net(solver).after_backward(reducer)
    if rank == 0:
        _call(solver, ("Solve", "solve"))  # steps, then snapshots and tests as one solver would
    else:
        _call(solver, ("Step", "step"), int(solver.param.max_iter) - int(solver.iter))
    reducer.comm.barrier()  # nobody leaves while rank 0 still snapshots (Caffe: the last barrier)


def _startup_checks(comm, solver, source: str) -> None:
    try:
        checks.check_same_definition(comm, solver, source)
        net = _solver_net(solver)
        checks.check_python_layers(net, comm.size, warn=comm.rank == 0)
    except ParallelError as exc:
        raise CollectiveError(str(exc)) from None
    if comm.rank == 0:
        checks.check_data_sharding(net, comm.size)


class _QuietNonRoot:
    """Only rank 0 prints INFO (Caffe's LOG_IF(INFO, Caffe::root_solver())); warnings still show."""

    def __init__(self, rank: int):
        self.rank = rank
        self.logger = logging.getLogger("caffe")
        self.level = None

    def __enter__(self):
        if self.rank != 0 and not os.environ.get("CAFFE_PARALLEL_VERBOSE"):
            self.level = self.logger.level
            if self.logger.getEffectiveLevel() < logging.WARNING:
                self.logger.setLevel(logging.WARNING)

    def __exit__(self, *exc):
        if self.level is not None:
            self.logger.setLevel(self.level)


# --------------------------------------------------------------------------------------------- mpiexec

def train_mpi(solver, *, snapshot=None, weights=None, gpus=None, timeout=None, on_solver=None, comm=None):
    """Train as this MPI rank (run every rank under mpiexec); returns this rank's solver.

    `solver`: a solver prototxt path or a SolverParameter (with any command-line overrides applied).
    `gpus`: None trains on CPUs with MPI reducing the gradients; a list of GPU ids (or "all") gives
    local rank i the GPU gpus[i] and reduces with NCCL. `timeout`: the watchdog's limit in seconds
    for one collective ($CAFFE_PARALLEL_TIMEOUT, default 1800). `on_solver(solver)` runs on each rank
    right after its solver is built (e.g. to install signal handling).
    """
    from caffe.parallel.mpi_comm import MPICommunicator
    if comm is None:
        comm = MPICommunicator(timeout=timeout)
    rank, size = comm.rank, comm.size
    source = os.path.abspath(os.fspath(solver)) if isinstance(solver, (str, os.PathLike)) else ""
    s = None
    try:
        with _QuietNonRoot(rank):
            if gpus is not None:
                local = comm.comm.Split_type(comm.MPI.COMM_TYPE_SHARED, key=rank)
                local_rank, local_size = local.Get_rank(), local.Get_size()
                local.Free()
                ids = select_gpus(gpus)
                if local_size > len(ids):  # only this machine's ranks know: they abort the job
                    raise ParallelError(f"{local_size} ranks run on {comm.host} but --gpu={gpus} gives only "
                                          f"{len(ids)} GPU(s) there; start at most {len(ids)} ranks per machine")
                context.set_mode_gpu()
                context.set_device(ids[local_rank])
            else:
                context.set_mode_cpu()
            s = build_rank_solver(solver, rank, size, weights=weights, snapshot=snapshot, on_solver=on_solver)
            _startup_checks(comm, s, source)
            if gpus is not None:
                from caffe.parallel.nccl import NCCL, new_uid
                uid = comm.bcast_object(new_uid() if rank == 0 else None)
                reducer = NCCL(s, uid)
            else:
                from caffe.parallel.mpi import MPIReducer
                reducer = MPIReducer(s, comm=comm)
            if rank == 0:
                log.info("Training on %d MPI ranks (%s)", size, f"GPUs {gpus}" if gpus is not None else "CPUs")
            run_rank(s, reducer, rank)
    except CollectiveError:
        raise  # every rank raises the same error: nobody waits
    except BaseException as exc:
        if size > 1:
            at = f" at iteration {s.iter}" if s is not None and hasattr(s, "iter") else " during start-up"
            sys.stderr.write("".join(traceback.format_exception(exc)))
            comm.abort(f"failed{at}: {type(exc).__name__}: {exc}")
        raise
    finally:
        comm.close()
    return s


# --------------------------------------------------------------------------------------------- spawn

def _gpu_rank_main(source, snapshot, weights, gpus, uid, rank, worker_init, on_solver):
    """One spawned GPU rank (Caffe's train.py solve())."""
    if worker_init is not None:
        worker_init(rank)
    context.set_mode_gpu()
    context.set_device(gpus[rank])
    from caffe.parallel.nccl import NCCL
    with _QuietNonRoot(rank):
        s = build_rank_solver(source, rank, len(gpus), weights=weights, snapshot=snapshot, on_solver=on_solver)
        checks.check_python_layers(_solver_net(s), len(gpus), warn=rank == 0)
        if rank == 0:
            checks.check_data_sharding(_solver_net(s), len(gpus))
        reducer = NCCL(s, uid)
        run_rank(s, reducer, rank)


def _rank_entry(target, args, rank, errors):
    try:
        target(*args)
    except BaseException as exc:
        errors.put((rank, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))))
        sys.exit(1)


def spawn_ranks(target, rank_args, labels=None, poll: float = 0.2) -> None:
    """Run target(*rank_args[r]) in one spawned process per rank and wait for all of them (`target` may
    also be a list, one callable per rank; callables must be picklable, e.g. module-level functions).

    When a rank fails (an exception, or an exit without one: a crash, the OOM killer), the others are
    stopped, since they would wait for it forever inside a collective, and ParallelError names it.
    """
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    labels = labels or [f"rank {r}" for r in range(len(rank_args))]
    procs = []
    try:
        targets = target if isinstance(target, (list, tuple)) else [target] * len(rank_args)
        for rank, args in enumerate(rank_args):
            p = ctx.Process(target=_rank_entry, args=(targets[rank], tuple(args), rank, errors), daemon=True,
                            name=f"caffe-{labels[rank].replace(' ', '')}")
            p.start()
            procs.append(p)
        failed = []
        while not failed and any(p.is_alive() for p in procs):
            for p in procs:
                p.join(poll / len(procs))
            failed = [(r, p) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        failed = [(r, p) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed:
            reports = {}
            while not errors.empty():
                r, msg, tb = errors.get()
                reports[r] = (msg, tb)
            # the rank that reported an exception explains more than the ranks that merely lost their peer
            r, p = next(((r, p) for r, p in failed if r in reports), failed[0])
            msg, tb = reports.get(r, (f"its process ended with exit code {p.exitcode} and no Python error (killed, "
                                      "or crashed in native code)", ""))
            if tb:
                sys.stderr.write(tb)
            raise ParallelError(f"{labels[r]} failed: {msg}; the other ranks were stopped")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 10
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()


def train_multi_gpu(solver, gpus, snapshot=None, weights=None, *, worker_init=None, on_solver=None) -> None:
    """Train on several GPUs of this machine, one spawned process per GPU (Caffe's train.py).

    `solver`: a solver prototxt path or a SolverParameter; `gpus`: ids as `--gpu` takes them ("0,1",
    "all", or a list); `snapshot`: a .solverstate every rank restores; `weights`: caffemodels
    (comma-separated) to start from. `worker_init(rank)` runs first in each process (e.g. to set up
    logging) and `on_solver(solver)` right after each rank's solver is built (e.g. to install signal
    handling); both must be picklable (module-level functions). Raises NoGPUError without a GPU or for ids that
    do not exist, MissingExtraError without the `nccl` extra, and ParallelError naming the rank and
    GPU when a rank fails (the others are then stopped).
    """
    from caffe.parallel.nccl import new_uid
    ids = select_gpus(gpus)
    source = _solver_source(solver)
    if not isinstance(source, str):
        source = source.SerializeToString()
    uid = new_uid()  # NCCL's rendezvous: created once here, handed to every rank
    log.info("Using GPUs %s", ids)
    spawn_ranks(_gpu_rank_main, [(source, snapshot, weights, ids, uid, r, worker_init, on_solver)
                                 for r in range(len(ids))],
                labels=[f"rank {r} (GPU {g})" for r, g in enumerate(ids)])
