"""Reading and writing protobuf files the way Caffe does, with errors that name the file.

Text (prototxt) parse errors carry the file, line and column; a very long token in the
message (a 150 KB line) is shortened. Reads go through caffe.blob.fileio: only regular
files, never more than protobuf's 2 GiB limit, so /dev/zero or a FIFO cannot hang or
exhaust memory. Binary reads name the file when it is missing, unreadable or not a valid
message. Writes are atomic (caffe.blob.fileio.atomic_open, re-exported here): a temporary
file beside the target, fsync, rename, so a crash never leaves a half-written caffemodel
under the real name.
"""
from __future__ import annotations

import os
import re

from google.protobuf import message as _message
from google.protobuf import text_format

from caffe.blob.fileio import (FileInputError, PROTO_LIMIT, atomic_open, atomic_path, atomic_write_bytes,
                               fsync_dir as _fsync_dir, read_regular_file, read_text_file)


class ProtoFileError(ValueError):
    """A protobuf file that cannot be read or parsed; `path` names it."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 column: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column

    def __reduce__(self):
        return type(self), (str(self), self.path, self.line, self.column)


_LOC_PREFIX = re.compile(r"^\s*\d+:\d+\s*:\s*")
_LONG_RUN = re.compile(r"[^\s\"']{81,}|\"[^\"]{81,}\"?|'[^']{81,}'?")
MESSAGE_LIMIT = 400


def shorten(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """An error detail fit for one line: long tokens elided in the middle, the whole capped at `limit`."""
    def elide(m):
        run = m.group(0)
        return f"{run[:40]}...({len(run) - 50} characters)...{run[-10:]}"
    text = _LONG_RUN.sub(elide, text)
    if len(text) > limit:
        text = f"{text[:limit - 30]}...({len(text) - limit + 30} more characters)"
    return text


def parse_text(text: str, msg, source: str = "<string>"):
    """Parse prototxt `text` into the message `msg`; errors name `source`, line and column."""
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        detail = shorten(_LOC_PREFIX.sub("", str(exc)))
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
        text = read_text_file(path, f"{kind} file", PROTO_LIMIT, "a prototxt")
    except FileInputError as exc:
        hint = "; binary files are read with the binary reader" if "not a text file" in str(exc) else ""
        raise ProtoFileError(f"{exc}{hint}", path) from None
    return parse_text(text, msg, source=path)


def read_binary(path, msg):
    """Parse the binary protobuf file `path` into `msg` (Caffe's ReadProtoFromBinaryFile)."""
    path = os.fspath(path)
    kind = type(msg).DESCRIPTOR.name
    try:
        data = read_regular_file(path, f"{kind} file", PROTO_LIMIT, "a protobuf message")
    except FileInputError as exc:
        raise ProtoFileError(str(exc), path) from None
    try:
        msg.ParseFromString(data)
        check_strings(msg)
    except (_message.DecodeError, RuntimeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtoFileError(f"Failed to parse {kind} file '{path}': the file is corrupt or not a "
                             f"binary {kind} ({len(data)} bytes; {shorten(str(exc))})", path) from None
    return msg


def check_strings(msg) -> None:
    """Refuse string fields that are not UTF-8: protobuf accepts them in proto2 messages and hands them out
    as bytes, which fail far from the file (a bytes layer name). Blobs (numbers only) are not walked."""
    for field, value in msg.ListFields():
        if field.type == field.TYPE_STRING:
            for item in (value if field.is_repeated else (value,)):
                if not isinstance(item, str):
                    raise ValueError(f"field {field.full_name} holds {bytes(item)[:40]!r}, not UTF-8 text")
        elif field.message_type is not None and field.message_type.name != "BlobProto":
            for item in (value if field.is_repeated else (value,)):
                check_strings(item)


def write_binary(path, msg) -> None:
    """Serialize `msg` to `path` atomically (Caffe's WriteProtoToBinaryFile)."""
    atomic_write_bytes(path, msg.SerializeToString(), f"{type(msg).DESCRIPTOR.name} file")


def write_text(path, msg) -> None:
    """Write `msg` as prototxt to `path` atomically (Caffe's WriteProtoToTextFile)."""
    text = text_format.MessageToString(msg).encode("utf-8")
    atomic_write_bytes(path, text, f"{type(msg).DESCRIPTOR.name} file")


__all__ = ["ProtoFileError", "parse_text", "read_text", "read_binary", "write_binary", "write_text", "shorten",
           "atomic_path", "atomic_open", "atomic_write_bytes"]
