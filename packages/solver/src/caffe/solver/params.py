"""Reading a SolverParameter, as Caffe's ReadSolverParamsFromTextFileOrDie does.

Parse the prototxt, upgrade the deprecated `solver_type` enum into the `type`
string (UpgradeSolverAsNeeded), and derive `snapshot_prefix` from the solver
file's name when it is not given, or put it inside the directory it names
(UpgradeSnapshotPrefixProperty). Net files named inside are read relative to
the current directory, as Caffe reads them.
"""
from __future__ import annotations

import logging
import os

from google.protobuf import text_format

from caffe.proto import caffe_pb2

log = logging.getLogger("caffe.solver")


class SolverError(ValueError):
    """A bad solver definition, solver state or training condition; the message names what is at fault."""


# SolverParameter.SolverType enum value -> the registered type name (upgrade_proto.cpp's UpgradeSolverType)
_SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


def upgrade_solver_as_needed(param, source: str = "<SolverParameter>") -> bool:
    """Move a deprecated `solver_type` (enum) into `type` (string). Returns True when the param was changed."""
    if not param.HasField("solver_type"):
        return False
    if param.HasField("type"):
        raise SolverError(f"{source}: failed to upgrade solver: old solver_type field (enum) and new type "
                          f"field (string) cannot be both specified in solver proto text")
    log.info("Attempting to upgrade input file specified using deprecated 'solver_type' field (enum)': %s",
             source)
    name = _SOLVER_TYPE_NAMES.get(param.solver_type)
    if name is None:
        raise SolverError(f"{source}: unknown SolverParameter solver_type: {param.solver_type}")
    param.type = name
    param.ClearField("solver_type")
    log.info("Successfully upgraded file specified using deprecated 'solver_type' field (enum) "
             "to 'type' field (string).")
    log.warning("Note that future Caffe releases will only support 'type' field (string) for a solver's type.")
    return True


def upgrade_snapshot_prefix(param, param_file: str) -> None:
    """Caffe's UpgradeSnapshotPrefixProperty: default the prefix to the solver file minus its extension;
    a prefix naming a directory gets the solver file's stem appended.

    Caffe tests has_snapshot_prefix(); an explicitly empty prefix is treated as absent here too, since
    an empty prefix would only scatter `_iter_N.caffemodel` files into the current directory.
    """
    if not param.HasField("snapshot_prefix") or not param.snapshot_prefix:
        param.snapshot_prefix = os.path.splitext(param_file)[0]
        log.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        stem = os.path.splitext(os.path.basename(param_file))[0]
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        log.info("snapshot_prefix is a directory and is set to %s", param.snapshot_prefix)


def parse_text(text: str, message, source: str):
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        from caffe.net.protofile import shorten  # a 150 KB line is not echoed whole
        raise SolverError(f"{source}: cannot parse as {type(message).__name__}: {shorten(str(exc))}") from None
    return message


def _read_text(path: str, what: str) -> str:
    """A regular text file, bounded (caffe.blob.fileio): /dev/zero or a FIFO is refused, not read."""
    from caffe.blob.fileio import FileInputError, read_text_file
    try:
        return read_text_file(path, what, fmt="a prototxt")
    except FileInputError as exc:
        if not os.path.exists(path):
            raise SolverError(f"{what} {path!r} not found (current directory: {os.getcwd()})") from None
        raise SolverError(str(exc)) from None


def read_solver_params(param_file) -> "caffe_pb2.SolverParameter":
    """ReadSolverParamsFromTextFileOrDie: parse, upgrade the solver type, default the snapshot prefix."""
    param_file = os.fspath(param_file)
    text = _read_text(param_file, "solver file")
    param = parse_text(text, caffe_pb2.SolverParameter(), f"solver file {param_file!r}")
    upgrade_solver_as_needed(param, param_file)
    upgrade_snapshot_prefix(param, param_file)
    return param


def read_net_params(path: str, field: str, solver_source: str | None = None):
    """Read a NetParameter prototxt named by the solver's `field` (net, train_net, test_net).

    Paths are relative to the current directory, as in Caffe; the error says so, and points out
    the file when it exists next to the solver file instead.
    """
    from caffe.proto import caffe_pb2 as pb
    if not os.path.exists(path):
        hint = ""
        if solver_source and not os.path.isabs(path):
            beside = os.path.join(os.path.dirname(solver_source), path)
            if os.path.exists(beside):
                hint = f"; a file {beside!r} exists next to the solver file: run from there or give that path"
        where = f"solver {solver_source!r}" if solver_source else "SolverParameter"
        raise SolverError(f"{where}: {field} file {path!r} not found (net paths are relative to the current "
                          f"directory {os.getcwd()!r}, as in Caffe){hint}")
    reader = _net_reader()
    if reader is not None:
        return reader(path)
    return parse_text(_read_text(path, f"{field} file"), pb.NetParameter(), f"{field} file {path!r}")


def _net_reader():
    """caffe.net's own prototxt reader (which upgrades old net formats), when it provides one."""
    import importlib
    for module_name in ("caffe.net.upgrade", "caffe.net"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, "ReadNetParamsFromTextFileOrDie", None)
        if callable(fn):
            return fn
    return None
