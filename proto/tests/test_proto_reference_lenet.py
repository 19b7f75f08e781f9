"""Snapshots written by real BVLC Caffe (9b891540) parse with this schema.

lenet_iter_{0,100}.caffemodel parse as NetParameter and lenet_iter_100.solverstate
as SolverState with no unknown field anywhere, and the weights are exactly the
arrays saved beside them. Skips when ../shared/reference/lenet is absent.
"""

from pathlib import Path

import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet

from caffe.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
LENET = SHARED / "reference" / "lenet"
PARAM_LAYERS = ["conv1", "conv2", "ip1", "ip2"]

needs_lenet = pytest.mark.skipif(
    not (LENET / "lenet_iter_100.caffemodel").is_file(),
    reason=f"reference LeNet snapshots not found in {LENET}",
)


def unknown_fields(msg, path="root"):
    """(path, count) for every message, nested or repeated, with unknown fields."""
    found = []
    n = len(UnknownFieldSet(msg))
    if n:
        found.append((path, n))
    for field, value in msg.ListFields():
        if field.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            continue
        items = value if field.is_repeated else [value]
        for i, sub in enumerate(items):
            found += unknown_fields(sub, f"{path}.{field.name}[{i}]")
    return found


def _load(cls, name):
    msg = cls()
    msg.ParseFromString((LENET / name).read_bytes())
    return msg


def _blob_array(blob):
    shape = tuple(blob.shape.dim)
    return np.asarray(blob.data, dtype=np.float32).reshape(shape)


def test_unknown_field_detection_works():
    # field 31, varint: not in BlobProto
    blob = caffe_pb2.BlobProto.FromString(b"\xf8\x01\x05")
    assert unknown_fields(blob) == [("root", 1)]
    net = caffe_pb2.NetParameter()
    net.layer.add().blobs.add().MergeFromString(b"\xf8\x01\x05")
    assert unknown_fields(net) == [("root.layer[0].blobs[0]", 1)]


@needs_lenet
@pytest.mark.parametrize("it", [0, 100])
def test_caffemodel_parses_without_unknown_fields(it):
    data = (LENET / f"lenet_iter_{it}.caffemodel").read_bytes()
    net = caffe_pb2.NetParameter.FromString(data)
    assert unknown_fields(net) == []
    assert net.name == "LeNet"
    names = [layer.name for layer in net.layer]
    for name in PARAM_LAYERS:
        assert name in names
    # Caffe (C++) serializes in field-number order with packed floats; so do we.
    assert net.SerializeToString() == data


@needs_lenet
@pytest.mark.parametrize("it", [0, 100])
def test_caffemodel_weights_match_arrays(it):
    net = _load(caffe_pb2.NetParameter, f"lenet_iter_{it}.caffemodel")
    layers = {layer.name: layer for layer in net.layer}
    for name in PARAM_LAYERS:
        blobs = layers[name].blobs
        assert len(blobs) == 2, name
        for blob, suffix in zip(blobs, ("w", "b")):
            expected = np.load(LENET / f"params_iter{it}" / f"{name}_{suffix}.npy")
            got = _blob_array(blob)
            assert got.dtype == np.float32 and expected.dtype == np.float32
            assert got.shape == expected.shape, (name, suffix)
            assert np.array_equal(got, expected), (name, suffix)
            assert len(blob.diff) == 0 and len(blob.double_data) == 0


@needs_lenet
def test_solverstate():
    data = (LENET / "lenet_iter_100.solverstate").read_bytes()
    state = caffe_pb2.SolverState.FromString(data)
    assert unknown_fields(state) == []
    assert state.iter == 100
    assert state.learned_net.endswith("lenet_iter_100.caffemodel")
    net = _load(caffe_pb2.NetParameter, "lenet_iter_100.caffemodel")
    layers = {layer.name: layer for layer in net.layer}
    param_shapes = [tuple(b.shape.dim) for name in PARAM_LAYERS for b in layers[name].blobs]
    history_shapes = [tuple(h.shape.dim) for h in state.history]
    assert history_shapes == param_shapes
    for h in state.history:
        hist = _blob_array(h)
        assert np.isfinite(hist).all()
    # SGD momentum history after 100 updates is not all zeros.
    assert any(np.any(_blob_array(h) != 0) for h in state.history)
    assert state.SerializeToString() == data
