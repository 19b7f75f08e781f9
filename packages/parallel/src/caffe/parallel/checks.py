"""Start-up checks of a data-parallel run: same model on every rank, Python layers, data sharding."""
from __future__ import annotations

import hashlib
import logging
import os

from caffe.parallel.comm import ParallelError

log = logging.getLogger("caffe.parallel")

# SolverParameter fields that may differ between ranks: the device, and where the net files are
# (their contents are compared through the built net's layers instead)
_PER_RANK_FIELDS = ("device_id", "net", "train_net", "test_net")


def definition_hash(solver) -> str:
    """SHA-256 of what every rank must agree on: the solver settings and the train net's layers."""
    param = type(solver.param)()
    param.CopyFrom(solver.param)
    for name in _PER_RANK_FIELDS:
        param.ClearField(name)
    h = hashlib.sha256(param.SerializeToString(deterministic=True))
    net = solver.net() if callable(getattr(solver, "net", None)) else solver.net
    for layer in net.layers:
        lp = type(layer.layer_param)()
        lp.CopyFrom(layer.layer_param)
        lp.ClearField("blobs")  # weights embedded in a prototxt are broadcast from rank 0 anyway
        h.update(lp.SerializeToString(deterministic=True))
    for blob in net.learnable_params:
        h.update(repr((blob.shape, str(blob.dtype))).encode())
    return h.hexdigest()


def check_same_definition(comm, solver, source: str = "") -> None:
    """Compare every rank's definition hash (allgather); raise naming the ranks that differ."""
    mine = (definition_hash(solver), comm_host(comm), str(source))
    every = comm.allgather_object(mine)
    groups: dict[str, list[int]] = {}
    for r, (digest, _, _) in enumerate(every):
        groups.setdefault(digest, []).append(r)
    if len(groups) == 1:
        return
    majority = max(groups.values(), key=len)
    lines = []
    for digest, ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
        where = "; ".join(f"rank {r} on {every[r][1]}: {every[r][2] or '(solver given as a message)'}"
                          for r in ranks)
        lines.append(f"  ranks {ranks} (definition {digest[:12]}): {where}")
    differ = sorted(r for rs in groups.values() if rs is not majority for r in rs)
    raise ParallelError(
        f"the solver or net definitions differ between ranks (ranks {differ} disagree with ranks {majority}): "
        "every rank must train the same model with the same settings; check that every machine has the same "
        "solver and net files:\n" + "\n".join(lines))


def comm_host(comm) -> str:
    return getattr(comm, "host", "") or os.uname().nodename


def check_python_layers(net, count: int, warn: bool = True) -> list[str]:
    """Python layers in a multi-rank TRAIN net.

    Caffe refuses a Python layer when it trains several GPUs from one process with threads (its CLI),
    because every thread would need Python's GIL (BVLC/caffe#2936), and allows it with one process per
    GPU (python/train.py). Every rank here is its own process, so Python layers run, one copy per rank:
    a Python layer that produces data must shard by caffe.solver_rank()/solver_count() itself.
    `share_in_parallel: true` asked Caffe's old thread mode to share one instance between the solvers;
    one instance cannot be shared between processes, so that is refused.
    """
    warnings = []
    if count <= 1:
        return warnings
    for layer in net.layers:
        if getattr(layer, "type", "") != "Python":
            continue
        pp = layer.layer_param.python_param
        name = f"Python layer '{layer.layer_param.name}' ({pp.module}.{pp.layer})"
        if pp.share_in_parallel:
            raise ParallelError(
                f"{name} sets python_param.share_in_parallel: true, but the {count} ranks are separate processes "
                "and cannot share one layer instance (Caffe refuses Python layers in its threaded multi-GPU mode "
                "and deprecated share_in_parallel); set it false and have the layer read its own share "
                "(caffe.solver_rank() of caffe.solver_count())")
        warnings.append(f"{name} runs in each of the {count} rank processes (as in Caffe's train.py; Caffe refuses "
                        "it only in its threaded multi-GPU mode, because of the GIL): if it produces data, it must "
                        "shard by caffe.solver_rank()/caffe.solver_count(), or every rank trains on the same batches")
    if warn:
        for w in warnings:
            log.warning("%s", w)
    return warnings


def database_entries(source: str, backend) -> int | None:
    """Number of records of a database (LMDB knows it), or None when it cannot be counted cheaply."""
    from caffe.layers import db as dbmod
    try:
        with dbmod.open_db(source, backend) as d:  # shares the Data layer's open environment
            return d.count()
    except Exception:
        return None


def check_data_sharding(net, count: int) -> list[str]:
    """Warnings for TRAIN Data layers whose database N ranks cannot split sensibly; also logged.

    The Data layer interleaves the ranks over the record stream (rank r reads positions r, r+N, ...,
    running on across wrap-arounds), so N ranks of batch b always see what one solver of batch N*b
    sees. What can still go wrong is a database smaller than that combined batch: every iteration
    then trains on some records twice (a rank count above the record count gives ranks no records of
    their own at all). Records that merely do not divide by N are harmless and only logged.
    """
    warnings = []
    if count <= 1:
        return warnings
    for layer in net.layers:
        if getattr(layer, "type", "") != "Data":
            continue
        p = layer.layer_param.data_param
        entries = database_entries(p.source, p.backend)
        if entries is None:
            continue
        name = f"Data layer '{layer.layer_param.name}' ({p.source}, {entries} records)"
        total = count * p.batch_size
        if entries < count:
            warnings.append(f"{name}: {count} ranks for {entries} records: {count - entries} ranks have no record of "
                            f"their own and every iteration repeats records; use at most {entries} ranks")
        elif entries < total:
            warnings.append(f"{name}: the {count} ranks' combined batch of {count} x {p.batch_size} = {total} exceeds "
                            f"the {entries} records, so every iteration trains on some records twice; use fewer "
                            f"ranks or a smaller batch_size (at most {entries // count})")
        elif entries % count:
            log.info("%s: the records do not divide by %d ranks; the ranks interleave over the record stream, so "
                     "training still matches one solver with a batch of %d", name, count, total)
    for w in warnings:
        log.warning("%s", w)
    return warnings
