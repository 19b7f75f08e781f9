"""Shared by the upgrade_* tools (Caffe's tools/upgrade_*.cpp): read a NetParameter/SolverParameter,
upgrade it with caffe.net.upgrade (NetNeedsUpgrade/UpgradeNetAsNeeded, SolverNeedsTypeUpgrade/
UpgradeSolverAsNeeded), write it (atomically) in the latest format."""
from __future__ import annotations

import logging

from caffe.cli.main import CliError

log = logging.getLogger("caffe")


def _upgrade_module():
    try:
        from caffe.net import upgrade
    except ImportError as exc:
        raise CliError(f"upgrading needs the caffe-net package (pip install caffe-net): {exc}") from None
    return upgrade


def upgrade_net(param, source: str) -> tuple[bool, bool]:
    """(needed, success): Caffe's NetNeedsUpgrade + UpgradeNetAsNeeded, in place."""
    up = _upgrade_module()
    if not up.NetNeedsUpgrade(param):
        return False, True
    return True, bool(up.UpgradeNetAsNeeded(param, source))


def upgrade_solver(param, source: str) -> tuple[bool, bool]:
    """(needed, success): Caffe's SolverNeedsTypeUpgrade + UpgradeSolverAsNeeded, in place."""
    up = _upgrade_module()
    if not up.SolverNeedsTypeUpgrade(param):
        return False, True
    return True, bool(up.UpgradeSolverAsNeeded(source, param))


def read_text(path: str, message):
    """A prototxt (caffe.net.protofile: a regular file, UTF-8; a binary file gets a clear error)."""
    from caffe.net.protofile import ProtoFileError, read_text as _read_text
    try:
        return _read_text(path, message)
    except ProtoFileError as exc:
        binary_net = "not a text file" in str(exc) and type(message).DESCRIPTOR.name == "NetParameter"
        hint = " (a binary caffemodel is upgraded with upgrade_net_proto_binary)" if binary_net else ""
        raise CliError(f"failed to parse input text file as {type(message).__name__}: {exc}{hint}") from None


def read_binary(path: str, message):
    from caffe.net.protofile import ProtoFileError, read_binary as _read_binary
    try:
        return _read_binary(path, message)
    except ProtoFileError as exc:
        raise CliError(f"failed to parse input binary file as {type(message).__name__}: {exc}") from None


def write(path: str, payload: bytes) -> None:
    """The output, atomically and with the mode any new file gets (caffe.blob.fileio)."""
    from caffe.blob.fileio import atomic_write_bytes
    try:
        atomic_write_bytes(path, payload, "output file")
    except OSError as exc:  # a WriteError: names the file and the reason
        raise CliError(str(exc)) from None


def run(argv: list[str], tool: str, kind: str, binary: bool) -> int:
    """The body of upgrade_net_proto_text / upgrade_net_proto_binary / upgrade_solver_proto_text."""
    from google.protobuf import text_format
    from caffe.proto import caffe_pb2
    what = "net" if kind == "net" else "solver"
    if len(argv) != 2 or any(a in ("-h", "--help") for a in argv):
        raise CliError(f"Usage: {tool} v0_{what}_proto_file_in {what}_proto_file_out")
    src, dst = argv
    message = caffe_pb2.NetParameter() if kind == "net" else caffe_pb2.SolverParameter()
    param = read_binary(src, message) if binary else read_text(src, message)
    needed, success = (upgrade_net if kind == "net" else upgrade_solver)(param, src)
    if not needed:
        log.error("File already in latest proto format: %s", src)
    if not success:
        log.error("Encountered error(s) while upgrading prototxt; see details above.")
    write(dst, param.SerializeToString() if binary else text_format.MessageToString(param).encode("utf-8"))
    log.info("Wrote upgraded %s %s proto to %s", type(param).__name__, "binary" if binary else "text", dst)
    return 0 if success else 1
