"""BlobProto <-> NumPy, fast in both directions.

Reading: `np.asarray(repeated_field)` is fast with upb. Writing: extending a
repeated float field element by element is ~40x slower than encoding the packed
field ourselves (tag, varint length, raw little-endian bytes) and merging it.
"""
from __future__ import annotations

import numpy as np

# Field numbers in caffe.proto's BlobProto (packed repeated fields).
_DATA, _DIFF, _DOUBLE_DATA, _DOUBLE_DIFF = 5, 6, 8, 9


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint encoding of a non-negative int."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def packed_field(field_number: int, array: np.ndarray, dtype) -> bytes:
    """The wire bytes of a packed repeated float/double field holding `array`."""
    raw = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    if not raw:
        return b""
    return varint((field_number << 3) | 2) + varint(len(raw)) + raw


def blob_proto_shape(proto) -> list[int]:
    if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or proto.HasField("width"):
        return [proto.num, proto.channels, proto.height, proto.width]
    return [int(d) for d in proto.shape.dim]


def blob_proto_arrays(proto, count: int):
    """(data, diff) as flat arrays (None when absent), checking their sizes against `count`."""
    def pick(single, double, what):
        if len(double):
            arr = np.asarray(double, dtype=np.float64)
        elif len(single):
            arr = np.asarray(single, dtype=np.float32)
        else:
            return None
        if arr.size != count:
            raise ValueError(f"BlobProto {what} holds {arr.size} values but its shape needs {count}")
        return arr
    data = pick(proto.data, proto.double_data, "data")
    diff = pick(proto.diff, proto.double_diff, "diff")
    if data is None and count and not len(proto.diff) and not len(proto.double_diff):
        raise ValueError(f"BlobProto has a shape of {count} elements but no data")
    return data, diff


def fill_blob_proto(blob, write_diff: bool = False, proto=None, double: bool = False):
    from caffe.proto import caffe_pb2
    if proto is None:
        proto = caffe_pb2.BlobProto()
    else:
        proto.Clear()
    proto.shape.dim.extend(blob.shape)
    dtype = np.float64 if double else np.float32
    payload = packed_field(_DOUBLE_DATA if double else _DATA, blob.cpu_data(), dtype)
    if write_diff:
        payload += packed_field(_DOUBLE_DIFF if double else _DIFF, blob.cpu_diff(), dtype)
    if payload:
        proto.MergeFromString(payload)
    return proto


def array_to_blob_proto(array, diff=None, double: bool = False):
    """pycaffe's caffe.io.array_to_blobproto: an N-d array (and optional diff) as a BlobProto."""
    from caffe.proto import caffe_pb2
    proto = caffe_pb2.BlobProto()
    array = np.asarray(array)
    proto.shape.dim.extend(array.shape)
    dtype = np.float64 if double else np.float32
    payload = packed_field(_DOUBLE_DATA if double else _DATA, array, dtype)
    if diff is not None:
        payload += packed_field(_DOUBLE_DIFF if double else _DIFF, np.asarray(diff), dtype)
    proto.MergeFromString(payload)
    return proto


def blob_proto_to_array(proto, return_diff: bool = False) -> np.ndarray:
    """pycaffe's caffe.io.blobproto_to_array."""
    shape = blob_proto_shape(proto)
    count = int(np.prod(shape)) if shape else 1
    data, diff = blob_proto_arrays(proto, count)
    arr = diff if return_diff else data
    if arr is None:
        raise ValueError("BlobProto has no " + ("diff" if return_diff else "data"))
    return arr.reshape(shape)
