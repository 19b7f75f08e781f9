"""Binary round trips and Caffe's wire encoding (packed where Caffe packs)."""

import struct

import numpy as np
from hypothesis import given, settings, strategies as st

from caffe.proto import caffe_pb2

INT32 = st.integers(-(2**31), 2**31 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)
FLOAT64 = st.floats(allow_nan=False)


@st.composite
def blob_protos(draw):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(draw(st.lists(st.integers(0, 2**40), max_size=6)))
    blob.data.extend(draw(st.lists(FLOAT32, max_size=64)))
    blob.diff.extend(draw(st.lists(FLOAT32, max_size=16)))
    blob.double_data.extend(draw(st.lists(FLOAT64, max_size=8)))
    if draw(st.booleans()):
        blob.num, blob.channels, blob.height, blob.width = draw(st.tuples(INT32, INT32, INT32, INT32))
    return blob


@st.composite
def datums(draw):
    datum = caffe_pb2.Datum()
    datum.channels = draw(st.integers(0, 4))
    datum.height = draw(st.integers(0, 64))
    datum.width = draw(st.integers(0, 64))
    datum.data = draw(st.binary(max_size=256))
    datum.label = draw(INT32)
    datum.float_data.extend(draw(st.lists(FLOAT32, max_size=32)))
    datum.encoded = draw(st.booleans())
    return datum


@settings(deadline=None)
@given(blob_protos())
def test_blobproto_round_trip(blob):
    data = blob.SerializeToString()
    again = caffe_pb2.BlobProto.FromString(data)
    assert again == blob
    assert list(again.shape.dim) == list(blob.shape.dim)
    assert np.array_equal(np.asarray(again.data, np.float32), np.asarray(blob.data, np.float32))
    assert again.SerializeToString() == data


@settings(deadline=None)
@given(datums())
def test_datum_round_trip(datum):
    data = datum.SerializeToString()
    again = caffe_pb2.Datum.FromString(data)
    assert again == datum
    assert again.data == datum.data
    assert again.SerializeToString() == data


def test_blobproto_data_is_packed():
    blob = caffe_pb2.BlobProto()
    blob.data.extend([1.0, 2.0, 3.0])
    # field 5, wire type 2 (length-delimited): one packed run of 3 * 4 bytes
    assert blob.SerializeToString() == b"\x2a\x0c" + struct.pack("<3f", 1.0, 2.0, 3.0)


def test_all_packed_fields_encode_packed():
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.diff.append(0.5)
    blob.double_data.append(1.5)
    blob.double_diff.append(-2.0)
    wire = blob.SerializeToString()
    assert wire == (
        b"\x32\x04" + struct.pack("<f", 0.5)        # diff = 6, packed
        + b"\x3a\x04" + b"\x0a\x02\x02\x03"          # shape = 7 { dim = 1, packed }
        + b"\x42\x08" + struct.pack("<d", 1.5)      # double_data = 8, packed
        + b"\x4a\x08" + struct.pack("<d", -2.0)     # double_diff = 9, packed
    )


def test_datum_float_data_is_not_packed():
    # Caffe declares `repeated float float_data = 6;` without [packed = true].
    datum = caffe_pb2.Datum()
    datum.float_data.extend([1.0, 2.0])
    assert datum.SerializeToString() == (
        b"\x35" + struct.pack("<f", 1.0) + b"\x35" + struct.pack("<f", 2.0))


def test_parsers_accept_both_encodings():
    unpacked = b"".join(b"\x2d" + struct.pack("<f", v) for v in (1.0, 2.0))
    assert list(caffe_pb2.BlobProto.FromString(unpacked).data) == [1.0, 2.0]
    packed = b"\x32\x08" + struct.pack("<2f", 3.0, 4.0)
    assert list(caffe_pb2.Datum.FromString(packed).float_data) == [3.0, 4.0]


def _varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_hand_packed_float_bytes_merge_into_blob():
    # The fast way to fill BlobProto.data from a big array: merge one packed run.
    arr = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    raw = arr.tobytes()
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([10, 100])
    blob.MergeFromString(b"\x2a" + _varint(len(raw)) + raw)
    assert np.array_equal(np.asarray(blob.data, np.float32), arr)
    slow = caffe_pb2.BlobProto()
    slow.shape.dim.extend([10, 100])
    slow.data.extend(arr.tolist())
    assert slow.SerializeToString() == blob.SerializeToString()
