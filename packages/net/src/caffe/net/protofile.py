"""Reading and writing protobuf files the way Caffe does, with errors that name the file.

Text (prototxt) parse errors carry the file, line and column. Binary reads name
the file when it is missing, unreadable or not a valid message. Writes are
atomic: a temporary file in the same directory, fsync, then os.replace, so a
crash never leaves a half-written caffemodel under the real name.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile

from google.protobuf import message as _message
from google.protobuf import text_format


class ProtoFileError(ValueError):
    """A protobuf file that cannot be read or parsed; `path` names it."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 column: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column


_LOC_PREFIX = re.compile(r"^\s*\d+:\d+\s*:\s*")


def parse_text(text: str, msg, source: str = "<string>"):
    """Parse prototxt `text` into the message `msg`; errors name `source`, line and column."""
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        detail = _LOC_PREFIX.sub("", str(exc))
        where = f"{source}:{line}:{col}" if line is not None else source
        kind = type(msg).DESCRIPTOR.name
        raise ProtoFileError(f"{where}: {detail} (failed to parse {kind} from {source}, "
                             f"line {line}, column {col})", source, line, col) from None
    return msg


def read_text(path, msg):
    """Parse the prototxt file `path` into `msg` (Caffe's ReadProtoFromTextFile, with a clear error)."""
    path = os.fspath(path)
    kind = type(msg).DESCRIPTOR.name
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ProtoFileError(f"Cannot open {kind} file '{path}': no such file", path) from None
    except IsADirectoryError:
        raise ProtoFileError(f"Cannot open {kind} file '{path}': it is a directory", path) from None
    except UnicodeDecodeError as exc:
        raise ProtoFileError(f"Failed to parse {kind} file '{path}': not a text prototxt "
                             f"({exc.reason} at byte {exc.start}); binary files are read with "
                             f"the binary reader", path) from None
    except OSError as exc:
        raise ProtoFileError(f"Cannot read {kind} file '{path}': {exc.strerror}", path) from None
    return parse_text(text, msg, source=path)


def read_binary(path, msg):
    """Parse the binary protobuf file `path` into `msg` (Caffe's ReadProtoFromBinaryFile)."""
    path = os.fspath(path)
    kind = type(msg).DESCRIPTOR.name
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ProtoFileError(f"Cannot open {kind} file '{path}': no such file", path) from None
    except IsADirectoryError:
        raise ProtoFileError(f"Cannot open {kind} file '{path}': it is a directory", path) from None
    except OSError as exc:
        raise ProtoFileError(f"Cannot read {kind} file '{path}': {exc.strerror}", path) from None
    try:
        msg.ParseFromString(data)
    except _message.DecodeError as exc:
        raise ProtoFileError(f"Failed to parse {kind} file '{path}': the file is corrupt or not a "
                             f"binary {kind} ({len(data)} bytes; {exc})", path) from None
    return msg


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to `path`; on success it is fsynced and renamed over `path`."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path):
    """A binary file object whose content replaces `path` atomically when the block succeeds."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            yield f
            f.flush()


def _fsync_dir(directory: str) -> None:
    # Make the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_binary(path, msg) -> None:
    """Serialize `msg` to `path` atomically (Caffe's WriteProtoToBinaryFile)."""
    with atomic_open(path) as f:
        f.write(msg.SerializeToString())


def write_text(path, msg) -> None:
    """Write `msg` as prototxt to `path` atomically (Caffe's WriteProtoToTextFile)."""
    with atomic_open(path) as f:
        f.write(text_format.MessageToString(msg).encode("utf-8"))
