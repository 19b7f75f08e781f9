"""Weights I/O: binary caffemodel and HDF5, both directions, atomic writes, and clear errors."""
import os
import re

import h5py
import numpy as np
import pytest
from google.protobuf import text_format

import caffe
from caffe.net import Net, ProtoFileError, WeightsError
from caffe.net.testing import input_layer, python_layer
from caffe.proto import caffe_pb2


def net_text(c=3, init="1", extra_layer="", share=False):
    spec = 'param { name: "w" }' if share else ""
    return "\n".join([
        'name: "w"', input_layer("input", {"data": (2, c)}),
        python_layer("a", "ChannelScale", ["data"], ["a"], param_str=init, extra=spec),
        python_layer("b", "ChannelScale", ["a"], ["b"], param_str=init, extra=spec), extra_layer,
        python_layer("loss", "SumSquaresLoss", ["b"], ["loss"], extra="loss_weight: 1")])


def trained_net(**kw):
    net = Net(net_text(**kw), caffe.TRAIN)
    rng = np.random.default_rng(1)
    for p in net.learnable_params:
        p.data[...] = rng.standard_normal(p.shape)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    net.ClearParamDiffs()
    net.ForwardBackward()
    return net


def assert_same_params(a, b):
    assert list(a.params) == list(b.params)
    for name in a.params:
        for pa, pb in zip(a.params[name], b.params[name]):
            np.testing.assert_array_equal(pa.data, pb.data)


def test_binary_roundtrip_and_wire_format(tmp_path):
    net = trained_net()
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    parsed = caffe_pb2.NetParameter.FromString(path.read_bytes())
    assert parsed == net.ToProto()  # the streamed file is exactly ToProto, as Caffe writes it
    assert [l.name for l in parsed.layer] == net.layer_names
    assert list(parsed.layer[1].blobs[0].shape.dim) == [3] and not len(parsed.layer[1].blobs[0].diff)
    fresh = Net(net_text(init="5"), caffe.TEST)
    fresh.copy_from(str(path))
    assert_same_params(net, fresh)
    legacy = Net(net_text(), str(path), caffe.TEST)  # pycaffe's Net(file, weights, phase)
    assert_same_params(net, legacy)
    assert_same_params(net, Net(net_text(), caffe.TEST, weights=str(path)))
    assert not [p for p in os.listdir(tmp_path) if p != "w.caffemodel"]  # no temporary left behind


def test_write_diff(tmp_path):
    net = trained_net()
    path = tmp_path / "d.caffemodel"
    net.Save(str(path), write_diff=True)
    blob = caffe_pb2.NetParameter.FromString(path.read_bytes()).layer[1].blobs[0]
    np.testing.assert_array_equal(np.asarray(blob.diff, np.float32), net.params["a"][0].diff)
    assert net.ToProto(write_diff=True) == caffe_pb2.NetParameter.FromString(path.read_bytes())


def test_large_blob_encoding(tmp_path):
    # lengths beyond 2**21 need multi-byte varints; values must survive bit-exactly
    net = Net(net_text(c=600_000), caffe.TEST)
    w = net.params["a"][0]
    w.data[...] = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    path = tmp_path / "big.caffemodel"
    net.save(str(path))
    other = Net(net_text(c=600_000), caffe.TEST, weights=str(path))
    np.testing.assert_array_equal(other.params["a"][0].data, w.data)


def test_double_net_writes_double_data(tmp_path):
    net = Net(net_text(init="0.1"), caffe.TEST, dtype=np.float64)
    proto = net.ToProto()
    assert len(proto.layer[1].blobs[0].double_data) == 3 and not len(proto.layer[1].blobs[0].data)
    net.save(str(tmp_path / "d.caffemodel"))
    assert caffe_pb2.NetParameter.FromString((tmp_path / "d.caffemodel").read_bytes()) == proto


def test_hdf5_roundtrip_layout_and_detection(tmp_path):
    net = trained_net()
    path = tmp_path / "w.h5"
    net.save_hdf5(str(path))
    with h5py.File(path, "r") as f:
        assert sorted(f["data"]) == sorted(net.layer_names) and "diff" not in f
        np.testing.assert_array_equal(f["data/a/0"][()], net.params["a"][0].data)
        assert len(f["data/input"]) == 0
    fresh = Net(net_text(init="5"), caffe.TEST)
    fresh.load_hdf5(str(path))
    assert_same_params(net, fresh)
    renamed = tmp_path / "weights.caffemodel"  # detected by the HDF5 magic, not the name
    os.replace(path, renamed)
    again = Net(net_text(init="5"), caffe.TEST)
    again.copy_from(str(renamed))
    assert_same_params(net, again)


def test_hdf5_shared_params_and_diffs(tmp_path):
    net = trained_net(share=True)
    path = tmp_path / "s.h5"
    net.ToHDF5(str(path), write_diff=True)
    with h5py.File(path, "r") as f:
        assert "0" in f["data/a"] and "0" not in f["data/b"]  # only the owner stores the data
        np.testing.assert_array_equal(f["diff/b/0"][()], net.params["b"][0].diff)
    fresh = Net(net_text(init="5", share=True), caffe.TEST)
    fresh.copy_from(str(path))  # the sharer's missing entry is fine
    assert_same_params(net, fresh)


def test_unknown_source_layers_are_ignored(tmp_path):
    extra = python_layer("c", "ChannelScale", ["b"], ["c"])
    big = trained_net(extra_layer=extra)
    path = tmp_path / "big.caffemodel"
    big.save(str(path))
    small = Net(net_text(init="5"), caffe.TEST, weights=str(path))
    np.testing.assert_array_equal(small.params["a"][0].data, big.params["a"][0].data)


def test_shape_mismatch_names_layer_index_shapes_and_file(tmp_path):
    path = tmp_path / "three.caffemodel"
    trained_net(c=3).save(str(path))
    other = Net(net_text(c=4), caffe.TEST)
    with pytest.raises(WeightsError, match=r"Cannot copy param 0 weights from layer 'a'; shape mismatch.  "
                                           r"Source param shape is 3 \(3\); target param shape is 4 \(4\)") as e:
        other.copy_from(str(path))
    assert str(path) in str(e.value)
    h5 = tmp_path / "three.h5"
    trained_net(c=3).save_hdf5(str(h5))
    with pytest.raises(WeightsError, match=r"param 0 weights from layer 'a'.*3 \(3\).*4 \(4\)"):
        other.copy_from(str(h5))


def test_blob_count_mismatch(tmp_path):
    param = caffe_pb2.NetParameter()
    layer = param.layer.add(name="a")
    for _ in range(2):
        layer.blobs.add().CopyFrom(caffe.io.array_to_blobproto(np.ones(3)))
    net = Net(net_text(), caffe.TEST)
    with pytest.raises(WeightsError, match="Incompatible number of blobs for layer 'a'.*has 2.*has 1"):
        net.CopyTrainedLayersFrom(param)


def test_v1_caffemodel_with_legacy_4d_blobs(tmp_path):
    old = caffe_pb2.NetParameter(name="old")
    layer = old.layers.add(name="a", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    blob = layer.blobs.add(num=1, channels=1, height=1, width=3)
    blob.data.extend([1.5, 2.5, 3.5])
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(old.SerializeToString())
    net = Net(net_text(), caffe.TEST, weights=str(path))
    np.testing.assert_array_equal(net.params["a"][0].data, [1.5, 2.5, 3.5])


def test_missing_and_corrupt_weight_files(tmp_path):
    net = Net(net_text(), caffe.TEST)
    missing = tmp_path / "nope.caffemodel"
    with pytest.raises(ProtoFileError, match=re.escape(f"Cannot open weights file '{missing}': no such file")):
        net.copy_from(str(missing))
    good = tmp_path / "good.caffemodel"
    trained_net().save(str(good))
    truncated = tmp_path / "truncated.caffemodel"
    truncated.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(ProtoFileError, match=re.escape(f"Failed to parse NetParameter file '{truncated}'")):
        net.copy_from(str(truncated))
    text = tmp_path / "model.prototxt"
    text.write_text(net_text())
    with pytest.raises(ProtoFileError, match=re.escape(str(text))):
        net.copy_from(str(text))
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(ProtoFileError, match=re.escape(f"'{empty}': it holds no layers")):
        net.copy_from(str(empty))
    not_model = tmp_path / "other.h5"
    with h5py.File(not_model, "w") as f:
        f["x"] = np.ones(3)
    with pytest.raises(WeightsError, match=re.escape(f"'{not_model}': no 'data' group")):
        net.copy_from(str(not_model))
    bad_h5 = tmp_path / "bad.h5"
    bad_h5.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(ProtoFileError, match=re.escape(f"Couldn't open HDF5 weights file '{bad_h5}'")):
        net.copy_from(str(bad_h5))


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    import caffe.net.weights as weights
    net = trained_net()
    path = tmp_path / "keep.caffemodel"
    net.save(str(path))
    before = path.read_bytes()

    def broken(f, layer, write_diff):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(weights, "_write_layer", broken)
    with pytest.raises(OSError, match="disk full"):
        net.save(str(path))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["keep.caffemodel"]


def test_saved_file_permissions_follow_umask(tmp_path):
    path = tmp_path / "perm.caffemodel"
    trained_net().save(str(path))
    mask = os.umask(0)
    os.umask(mask)
    assert (os.stat(path).st_mode & 0o777) == (0o666 & ~mask)


def test_to_proto_keeps_layer_definitions():
    net = trained_net()
    proto = net.ToProto()
    assert proto.name == "w" and proto.layer[1].python_param.layer == "ChannelScale"
    assert proto.layer[1].phase == caffe.TRAIN and list(proto.layer[-1].loss_weight) == [1.0]
    # the definition part re-parses as a net
    text = text_format.MessageToString(proto)
    again = Net(text, caffe.TEST)
    assert_same_params(net, again)  # ...and the layers pick up the blobs stored in the definition
