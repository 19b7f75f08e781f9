"""Caffe's own tool (tools/caffe.cpp): train, test, time, device_query.

Flags keep Caffe's names and meanings: solver, model, weights (comma-separated), snapshot, iterations
(default 50), gpu (ids or `all`), phase, level, stage (comma-separated), sigint_effect (default stop),
sighup_effect (default snapshot). Log lines keep Caffe's wording so parse_log scripts work.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from caffe.blob import deferred

log = logging.getLogger("caffe")


from caffe.cli.main import CliError, GflagsParser  # noqa: E402


def caffe_flags(prog: str, usage: str, fold: bool = False) -> GflagsParser:
    """The flags of Caffe's tool (tools/caffe.cpp), with Caffe's defaults (and --fold for test/time)."""
    p = GflagsParser(prog, usage)
    if fold:
        p.add_flag("fold", bool, None, "inference folding of BatchNorm/Scale/ReLU into the Convolution or "
                   "InnerProduct before them, TEST phase only; unset: the environment variable CAFFE_FOLD, "
                   "else on")
    p.add_flag("gpu", str, "", "GPU device ids separated by ',' or 'all' (CPU when empty)")
    p.add_flag("solver", str, "", "the solver definition protocol buffer text file")
    p.add_flag("model", str, "", "the model definition protocol buffer text file")
    p.add_flag("phase", str, "", "network phase (TRAIN or TEST); only used for 'time'")
    p.add_flag("level", int, 0, "network level")
    p.add_flag("stage", str, "", "network stages (not to be confused with phase), separated by ','")
    p.add_flag("snapshot", str, "", "the snapshot solver state to resume training")
    p.add_flag("weights", str, "", "pretrained weights to initialize finetuning, separated by ','; "
               "cannot be set simultaneously with snapshot")
    p.add_flag("iterations", int, 50, "the number of iterations to run")
    p.add_flag("sigint_effect", str, "stop", "action to take on SIGINT: snapshot, stop or none")
    p.add_flag("sighup_effect", str, "snapshot", "action to take on SIGHUP: snapshot, stop or none")
    p.add_flag("overwrite_snapshots", bool, False, "train even while another training holds the lock on the "
               "same snapshot_prefix (their snapshots overwrite each other); by default that is refused")
    return p


def _parsed(prog: str, usage: str, argv, fold: bool = False):
    parser = caffe_flags(prog, usage, fold)
    args = parser.parse(argv)
    if args.args:
        raise CliError(f"unexpected arguments: {' '.join(args.args)}\n{parser.format_usage().strip()}")
    return args


def train_main(argv) -> int:
    return train(_parsed("train", "train or finetune a model: caffe-cli train --solver=S [--snapshot=F | "
                         "--weights=W] [--gpu=...]", argv))


def test_main(argv) -> int:
    return test(_parsed("test", "score a model: caffe-cli test --model=M --weights=W [--iterations=50]", argv,
                        fold=True))


def time_main(argv) -> int:
    return time_net(_parsed("time", "benchmark model execution time: caffe-cli time --model=M "
                            "[--iterations=50]", argv, fold=True))


def device_query_main(argv) -> int:
    return device_query(_parsed("device_query", "show GPU diagnostic information", argv))


# -- shared helpers -------------------------------------------------------------------

def require_file(path: str, flag: str) -> str:
    """A flag's file must exist and be a regular file: /dev/zero or a FIFO is refused before any read."""
    from caffe.blob.fileio import FileInputError, require_regular_file
    if not os.path.exists(path):
        raise CliError(f"--{flag}: file not found: {path}")
    try:
        require_regular_file(path, f"--{flag} file")
    except FileInputError as exc:
        raise CliError(str(exc)) from None
    return path


def parse_gpus(spec: str) -> list[int]:
    """'' -> [], '0,1' -> [0, 1], 'all' -> every visible GPU; errors when no usable GPU."""
    if not spec:
        return []
    from caffe.blob import context
    if not context.gpu_available():
        raise CliError(f"--gpu={spec}: no usable GPU ({context._probe_gpu()[1]}); run without --gpu for the CPU")
    count = context.gpu_count()
    if spec == "all":
        return list(range(count))
    try:
        ids = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--gpu={spec}: expected comma-separated device ids or 'all'") from None
    for i in ids:
        if not 0 <= i < count:
            raise CliError(f"--gpu={spec}: GPU {i} does not exist ({count} GPU(s) visible)")
    return ids


def parse_phase(spec: str, default: int) -> int:
    if not spec:
        return default
    if spec.upper() == "TRAIN":
        return 0
    if spec.upper() == "TEST":
        return 1
    raise CliError(f"--phase={spec}: expected TRAIN or TEST")


def parse_stages(spec: str) -> list[str]:
    return [s for s in spec.split(",") if s] if spec else []


def signal_effect(spec: str, flag: str):
    from caffe.solver import action_from_string
    try:
        return action_from_string(spec)
    except ValueError:
        raise CliError(f"--{flag}={spec}: expected one of stop, snapshot, none") from None


def copy_weights(nets, weights: str) -> None:
    """Caffe's CopyLayers: each comma-separated weights file into every given net."""
    for path in [w for w in weights.split(",") if w]:
        require_file(path, "weights")
        for net in nets:
            net.CopyTrainedLayersFrom(path)


def set_mode(gpus: list[int]) -> None:
    import caffe
    if gpus:
        caffe.set_device(gpus[0])
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()


# -- train ------------------------------------------------------------------------------

def training_gpus(param, gpu_flag: str, solver_path: str = "the solver") -> list[int]:
    """The GPUs to train on: --gpu when given; else, as Caffe, the solver's solver_mode: GPU on its
    device_id (GPU 0 when unset); CPU (a warning) when the solver asks for a GPU and none is usable."""
    if gpu_flag or param.solver_mode != param.GPU:
        return parse_gpus(gpu_flag)
    from caffe.blob import context
    if not context.gpu_available():
        log.warning("The solver asks for solver_mode: GPU (device %d) but there is no usable GPU (%s); "
                    "training on the CPU", param.device_id, context._probe_gpu()[1])
        return []
    try:
        return parse_gpus(str(param.device_id))
    except CliError as exc:
        raise CliError(f"{solver_path}: solver_mode GPU, device_id {param.device_id}: {exc}") from None


def train(args) -> int:
    import caffe
    from caffe.solver import read_solver_params, create_solver, SignalHandler
    if not args.solver:
        raise CliError("Need a solver definition to train: pass --solver=SOLVER.prototxt")
    if args.snapshot and args.weights:
        raise CliError("Give a snapshot to resume training or weights to finetune but not both "
                       "(--snapshot and --weights)")
    require_file(args.solver, "solver")
    if args.snapshot:
        require_file(args.snapshot, "snapshot")
    param = read_solver_params(args.solver)
    param.train_state.level = args.level
    for s in parse_stages(args.stage):
        param.train_state.stage.append(s)
    gpus = training_gpus(param, args.gpu, args.solver)
    world = _mpi_world()
    if len(gpus) > 1 or world is not None:
        # data-parallel: one process per GPU (train.py's way) or one per MPI rank (mpiexec -n N caffe-cli ...)
        import functools
        from caffe.parallel import launch
        on_solver = functools.partial(_install_signal_handling, args.sigint_effect, args.sighup_effect,
                                      overwrite_snapshots=args.overwrite_snapshots)
        if world is not None:
            launch.train_mpi(param, snapshot=args.snapshot or None, weights=args.weights or None,
                             gpus=gpus or None, on_solver=on_solver)
        else:
            launch.train_multi_gpu(param, gpus, snapshot=args.snapshot or None, weights=args.weights or None,
                                   on_solver=on_solver)
        return 0
    if gpus:
        param.device_id = gpus[0]
        param.solver_mode = param.GPU
        log.info("Using GPUs %s", ", ".join(map(str, gpus)))
    else:
        param.solver_mode = param.CPU
        log.info("Use CPU.")
    set_mode(gpus)
    handler = SignalHandler(signal_effect(args.sigint_effect, "sigint_effect"),
                            signal_effect(args.sighup_effect, "sighup_effect"))
    log.info("Starting Optimization")
    with handler:
        solver = create_solver(param)
        solver.overwrite_snapshots = args.overwrite_snapshots
        solver.SetActionFunction(handler.GetActionFunction())
        if args.snapshot:
            log.info("Resuming from %s", args.snapshot)
            solver.restore(args.snapshot)
        elif args.weights:
            copy_weights([solver.net] + list(solver.test_nets), args.weights)
        progress = _progress_for(solver, param)
        try:
            solver.solve()
        finally:
            if progress is not None:
                progress.close()
    _final_summary(solver)
    return 0


def _final_summary(solver) -> None:
    """The main job ends with the test accuracy and the snapshot path: say them plainly. Test figures
    only when the solver tested at the final iteration (as Caffe does when max_iter is a multiple of
    test_interval); figures from an earlier test would describe other weights than the saved ones."""
    tested_at = getattr(solver, "mean_scores_iter", [])
    for net_id, scores in enumerate(getattr(solver, "mean_scores", []) or []):
        if net_id >= len(tested_at) or tested_at[net_id] != solver.iter:
            continue
        names = solver.test_nets[net_id].output_blob_names if net_id < len(solver.test_nets) else []
        for name, value in zip(names, scores):
            log.info("Final test net #%d: %s = %g", net_id, name, value)
    if solver.last_snapshot:
        model, state = solver.last_snapshot
        log.info("Final snapshot: %s (solver state %s)", model, state)


def _install_signal_handling(sigint_effect: str, sighup_effect: str, solver,
                             overwrite_snapshots: bool = False) -> None:
    """on_solver hook for every rank: Caffe's SIGINT/SIGHUP effects (module level, so spawn can pickle it)."""
    solver.overwrite_snapshots = overwrite_snapshots
    from caffe.solver import SignalHandler
    handler = SignalHandler(signal_effect(sigint_effect, "sigint_effect"),
                            signal_effect(sighup_effect, "sighup_effect")).install()
    solver.SetActionFunction(handler.GetActionFunction())


def _mpi_world():
    try:
        from caffe.parallel.launch import mpi_world
    except ImportError:
        return None
    return mpi_world()


def _progress_for(solver, param):
    from caffe.cli.progress import Progress
    return Progress.attach(solver, param.max_iter)


# -- test -------------------------------------------------------------------------------

def _load_net(args, default_phase: int, purpose: str):
    """test and time: check --model, pick the device, build the net, copy --weights. Returns (net, gpus)."""
    from caffe.net import Net
    if not args.model:
        raise CliError(f"Need a model definition to {purpose}: pass --model=NET.prototxt")
    require_file(args.model, "model")
    gpus = parse_gpus(args.gpu)
    set_mode(gpus[:1])
    log.info("Use %s.", f"GPU {gpus[0]}" if gpus else "CPU")
    net = Net(args.model, parse_phase(args.phase, default_phase), level=args.level,
              stages=parse_stages(args.stage), fold=getattr(args, "fold", None))
    if args.weights:
        copy_weights([net], args.weights)
    return net, gpus


def test(args) -> int:
    import caffe
    if args.model and not args.weights:
        raise CliError("Need model weights to score: pass --weights=MODEL.caffemodel")
    net, _ = _load_net(args, caffe.TEST, "score")
    log.info("Running for %d iterations.", args.iterations)
    test_score: list[float] = []
    test_score_output_id: list[int] = []
    loss = 0.0
    names = net.output_blob_names
    for i in range(args.iterations):
        iter_loss = float(net.Forward())  # GPU mode: read from the device (its outputs are read below anyway)
        deferred.flush()
        loss += iter_loss
        idx = 0
        for j, blob in enumerate(net.output_blobs):
            values = blob.cpu_data().ravel()
            for k in range(values.size):
                score = float(values[k])
                if i == 0:
                    test_score.append(score)
                    test_score_output_id.append(j)
                else:
                    test_score[idx] += score
                idx += 1
                log.info("Batch %d, %s = %g", i, names[j], score)
    loss /= args.iterations
    log.info("Loss: %g", loss)
    for i, score in enumerate(test_score):
        j = test_score_output_id[i]
        name = names[j]
        weight = net.blob_loss_weights[net.output_blob_indices[j]]
        mean = score / args.iterations
        loss_msg = f" (* {weight:g} = {weight * mean:g} loss)" if weight else ""
        log.info("%s = %g%s", name, mean, loss_msg)
    return 0


# -- time -------------------------------------------------------------------------------

def time_net(args) -> int:
    import caffe
    net, gpus = _load_net(args, caffe.TRAIN, "time")
    sync = _synchronizer(gpus)
    folded = net.folded
    if folded:  # the first pass unfolded, so every layer has its forward state for the timed backward
        net.fold(False)
    log.info("Performing Forward")
    initial_loss = float(net.Forward())
    log.info("Initial loss: %g", initial_loss)
    log.info("Performing Backward")
    net.Backward()
    if folded:
        net.fold(True)
    layers = net.layers
    n = len(layers)
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    bottom_need_backward = net.bottom_need_backward
    steps = net.forward_steps()  # a folded chain is one step, timed as its first layer
    for first, last, _ in steps:
        if last > first:
            log.info("Folded into %s: %s (their time is counted there)", layers[first].name,
                     ", ".join(layer.name for layer in layers[first + 1:last + 1]))
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", args.iterations)
    total_start = time.perf_counter()
    forward_total = backward_total = 0.0
    for it in range(args.iterations):
        iter_start = time.perf_counter()
        t0 = time.perf_counter()
        for first, _, run in steps:
            s = time.perf_counter()
            run()
            sync()
            fwd[first] += time.perf_counter() - s
        forward_total += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(n - 1, -1, -1):
            s = time.perf_counter()
            layers[i].Backward(net.top_vecs[i], bottom_need_backward[i], net.bottom_vecs[i])
            sync()
            bwd[i] += time.perf_counter() - s
        backward_total += time.perf_counter() - t0
        log.info("Iteration: %d forward-backward time: %.4g ms.", it + 1,
                 (time.perf_counter() - iter_start) * 1e3)
    total = time.perf_counter() - total_start
    iters = max(args.iterations, 1)
    log.info("Average time per layer: ")
    for i, layer in enumerate(layers):
        log.info("%10s\tforward: %.5g ms.", layer.name, fwd[i] * 1e3 / iters)
        log.info("%10s\tbackward: %.5g ms.", layer.name, bwd[i] * 1e3 / iters)
    log.info("Average Forward pass: %.5g ms.", forward_total * 1e3 / iters)
    log.info("Average Backward pass: %.5g ms.", backward_total * 1e3 / iters)
    log.info("Average Forward-Backward: %.5g ms.", total * 1e3 / iters)
    log.info("Total Time: %.5g ms.", total * 1e3)
    log.info("*** Benchmark ends ***")
    return 0


def _synchronizer(gpus):
    if not gpus:
        return lambda: None
    import cupy
    return cupy.cuda.Device().synchronize


# -- device_query -------------------------------------------------------------------------

def device_query(args) -> int:
    from caffe.blob import context
    if not context.gpu_available():
        log.info("%s", context.device_query())
        return 0
    ids = parse_gpus(args.gpu or "all")
    for i in ids:
        log.info("Querying GPUs %d", i)
        for line in context.device_query(i).splitlines():
            log.info("%s", line)
    return 0
