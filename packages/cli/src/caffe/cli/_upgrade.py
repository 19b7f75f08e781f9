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
    from google.protobuf import text_format
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CliError(f"cannot open '{path}': {exc.strerror or exc}") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise CliError(f"failed to parse input text file as {type(message).__name__}: {path}: {exc}") from None
    return message


def read_binary(path: str, message):
    from google.protobuf.message import DecodeError
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CliError(f"cannot open '{path}': {exc.strerror or exc}") from None
    try:
        message.ParseFromString(raw)
    except (DecodeError, RuntimeError) as exc:
        raise CliError(f"failed to parse input binary file as {type(message).__name__}: {path}: {exc}") from None
    return message


def write(path: str, payload: bytes) -> None:
    from caffe.cli.compute_image_mean import write_binary_atomically
    try:
        write_binary_atomically(path, payload)
    except OSError as exc:
        raise CliError(f"cannot write '{path}': {exc.strerror or exc}") from None


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
