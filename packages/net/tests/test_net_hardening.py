"""Hostile inputs to Net and its loaders: endless streams and FIFOs, nets too big for memory, damaged HDF5
weights, 150 KB prototxt lines, reshape errors without a layer name, and weights that fill only part of a net."""
import logging
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import caffe
from caffe.blob import memory
from caffe.blob.memory import BlobMemoryError
from caffe.layers import LayerError
from caffe.net import Net, ProtoFileError, WeightsError

LENET = """name: "LeNet"
layer { name: "data" type: "Input" top: "data" input_param { shape: { dim: 64 dim: 1 dim: 28 dim: 28 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""

SMALL = LENET.replace("dim: 64 dim: 1", "dim: 2 dim: 1")


def _child(code: str, timeout: float = 300):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# -- unbounded reads ---------------------------------------------------------------------------------

def test_dev_zero_as_model_or_weights_is_refused_at_once():
    with pytest.raises(ProtoFileError, match=r"'/dev/zero': it is a character device, not a regular file"):
        Net("/dev/zero", caffe.TEST)
    net = Net(SMALL, caffe.TEST)
    with pytest.raises(ProtoFileError, match=r"weights file '/dev/zero': it is a character device"):
        net.CopyTrainedLayersFrom("/dev/zero")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_as_model_or_weights_does_not_block(tmp_path):
    fifo = tmp_path / "model.prototxt"
    os.mkfifo(fifo)
    proc = _child(f"""
        import caffe
        from caffe.net import Net, ProtoFileError
        try:
            Net({str(fifo)!r}, caffe.TEST)
        except ProtoFileError as exc:
            print("model:", exc)
        net = Net({SMALL!r}, caffe.TEST)
        try:
            net.CopyTrainedLayersFrom({str(fifo)!r})
        except ProtoFileError as exc:
            print("weights:", exc)
        """, timeout=120)
    assert "model: Cannot read NetParameter file" in proc.stdout and "it is a FIFO" in proc.stdout, proc.stderr
    assert "weights: Cannot read weights file" in proc.stdout


# -- clear errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ['name: "' + "x" * 150_000, "name: " + "x" * 150_000,
                                  "layer { " + "a" * 150_000 + " }", 'name: "LeNet" ' + "9" * 150_000])
def test_a_150kb_line_is_not_echoed_whole(tmp_path, line):
    p = tmp_path / "long.prototxt"
    p.write_text(line + "\n" + SMALL)
    with pytest.raises(ProtoFileError) as info:
        Net(str(p), caffe.TEST)
    msg = str(info.value)
    assert len(msg) < 1000 and str(p) in msg and ":1:" in msg and "characters)" in msg


def test_reshape_errors_name_the_layer():
    with pytest.raises(LayerError, match=r"Layer 'data' \(Input\) of net 'LeNet': Blob.reshape: negative dimension"):
        Net(SMALL.replace("dim: 28 dim: 28", "dim: 28 dim: -3"), caffe.TEST)
    with pytest.raises(LayerError, match=r"Layer 'ip1' \(InnerProduct\) of net 'LeNet': .*more than INT_MAX"):
        Net(SMALL.replace("num_output: 500", "num_output: 2000000000"), caffe.TEST)


# -- memory ------------------------------------------------------------------------------------------

@pytest.fixture
def little_memory(monkeypatch):
    """Pretend 100 MiB are available (memory.available_memory is what every check asks)."""
    monkeypatch.setattr(memory, "available_memory", lambda: 100 << 20)


def test_top_too_big_for_memory_is_refused_before_allocation(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 30)
    with pytest.raises(BlobMemoryError) as info:
        Net(LENET.replace("dim: 28 dim: 28", "dim: 28 dim: 65536"), caffe.TEST)  # the Input width
    msg = str(info.value)
    assert "Net 'LeNet': not enough memory at layer 'conv1' (Convolution): its top 'conv1' (shape 64 20 24 65532" \
           in msg and "7.5 GiB (8052572160 bytes)" in msg and "only 1.0 GiB" in msg
    assert isinstance(info.value, MemoryError) and info.value.nbytes > info.value.available


def test_parameter_too_big_for_memory_names_layer_and_shape(little_memory):
    with pytest.raises(BlobMemoryError) as info:
        Net(SMALL.replace("num_output: 500", "num_output: 99999"), caffe.TEST)  # the num_output
    msg = str(info.value)
    assert msg.startswith("Layer 'ip1' (InnerProduct) of net 'LeNet': out of memory for ")
    assert "shape 99999 800" in msg and "305.2 MiB (319996800 bytes)" in msg


def test_train_net_counts_the_diffs(monkeypatch):
    big = LENET.replace("dim: 64 dim: 1", "dim: 640 dim: 1")
    net = Net(big, caffe.TRAIN)
    data = sum(b.count() * 4 for b in net._blobs)
    assert data > memory.CHECK_THRESHOLD
    # enough for the data, not for data and diffs
    monkeypatch.setattr(memory, "available_memory", lambda: int(data * 1.2) + (20 << 20))
    assert Net(big, caffe.TEST)
    with pytest.raises(BlobMemoryError, match=r"Net 'LeNet' \(TRAIN\): its blobs' data and diffs need .*largest: "
                                              r"blob 'conv1' \(d"):
        Net(big, caffe.TRAIN)


def test_nets_that_fit_are_built_as_before():
    net = Net(LENET, caffe.TRAIN)
    assert net.blobs["conv1"].shape == (64, 20, 24, 24)


def test_real_address_space_limit_gives_the_error_not_the_oom_killer():
    # the case with a real limit (ulimit -v), in a child: the check reads RLIMIT_AS
    proc = _child(f"""
        import resource
        vm = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize")][0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        import caffe
        from caffe.blob.memory import BlobMemoryError
        try:
            caffe.Net({LENET.replace("dim: 28 dim: 28", "dim: 28 dim: 65536")!r}, caffe.TEST)
        except BlobMemoryError as exc:
            print("ERR", exc)
        """)
    assert "ERR Net 'LeNet': not enough memory at layer 'conv1' (Convolution)" in proc.stdout, proc.stderr[-3000:]


# -- weights -----------------------------------------------------------------------------------------

def _save_h5(net, path, edit):
    net.ToHDF5(str(path))
    with h5py.File(path, "a") as f:
        edit(f)
    return str(path)


def test_hdf5_group_where_a_dataset_belongs(tmp_path):
    net = Net(SMALL, caffe.TEST)

    def edit(f):
        del f["data/conv1/0"]
        f["data/conv1"].create_group("0")
    path = _save_h5(net, tmp_path / "w.h5", edit)
    with pytest.raises(WeightsError, match=r"'.*w.h5': data/conv1/0 \(param 0 of layer 'conv1'\) is a group, not a "
                                           r"dataset"):
        net.CopyTrainedLayersFrom(path)


def test_hdf5_string_dataset(tmp_path):
    net = Net(SMALL, caffe.TEST)

    def edit(f):
        del f["data/ip2/1"]
        f["data/ip2"].create_dataset("1", data=np.array([b"a"] * 10))
    path = _save_h5(net, tmp_path / "s.h5", edit)
    with pytest.raises(WeightsError, match=r"'.*s.h5': data/ip2/1 \(param 1 of layer 'ip2'\) holds strings"):
        net.CopyTrainedLayersFrom(path)


def test_hdf5_layer_stored_as_a_dataset(tmp_path):
    net = Net(SMALL, caffe.TEST)

    def edit(f):
        del f["data/ip1"]
        f["data"].create_dataset("ip1", data=np.zeros(3))
    path = _save_h5(net, tmp_path / "d.h5", edit)
    with pytest.raises(WeightsError, match=r"data/ip1 is a dataset, but an HDF5 caffemodel stores layer 'ip1' as a "
                                           r"group"):
        net.CopyTrainedLayersFrom(path)


def _layer_boundaries(raw: bytes):
    """Byte offsets where each NetParameter.layer (field 100) entry ends."""
    from google.protobuf.internal.decoder import _DecodeVarint
    pos, ends = 0, []
    while pos < len(raw):
        tag, pos = _DecodeVarint(raw, pos)
        assert tag & 7 == 2
        length, pos = _DecodeVarint(raw, pos)
        pos += length
        if tag >> 3 == 100:
            ends.append(pos)
    return ends


def test_caffemodel_cut_at_a_layer_boundary_names_the_layers_left_out(tmp_path, caplog):
    net = Net(SMALL, caffe.TEST)
    full = tmp_path / "full.caffemodel"
    net.Save(str(full))
    raw = full.read_bytes()
    ends = _layer_boundaries(raw)
    cut = tmp_path / "cut.caffemodel"
    cut.write_bytes(raw[:ends[3]])  # data, conv1, pool1, conv2: conv2 is the last one whole
    other = Net(SMALL, caffe.TEST)
    with caplog.at_level(logging.INFO, logger="caffe.net"):
        other.CopyTrainedLayersFrom(str(cut))
    messages = [r.getMessage() for r in caplog.records]
    assert "Copying source layer conv1 Type:Convolution #blobs=2" in messages
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "2 layer(s) with parameters got no weights from" in warning[0]
    assert "'ip1', 'ip2'" in warning[0] and "cut.caffemodel" in warning[0]
    np.testing.assert_array_equal(other.params["conv2"][0].data, net.params["conv2"][0].data)


def test_caffemodel_of_another_net_is_reported(tmp_path, caplog):
    net = Net(SMALL.replace('"conv', '"c').replace('"ip', '"fc'), caffe.TEST)  # same shapes, other names
    path = tmp_path / "other.caffemodel"
    net.Save(str(path))
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        Net(SMALL, caffe.TEST).CopyTrainedLayersFrom(str(path))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("No layer of the net got weights from") and "another net" in warning
    assert "'conv1', 'conv2', 'ip1', 'ip2'" in warning


def test_complete_caffemodel_loads_without_a_warning(tmp_path, caplog):
    net = Net(SMALL, caffe.TEST)
    path = tmp_path / "w.caffemodel"
    net.Save(str(path))
    with caplog.at_level(logging.WARNING, logger="caffe.net"):
        Net(SMALL, caffe.TEST).CopyTrainedLayersFrom(str(path))
        Net(SMALL, caffe.TEST).CopyTrainedLayersFrom(_save_h5(net, tmp_path / "w.h5", lambda f: None))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_outputs_follow_the_umask(tmp_path):
    net = Net(SMALL, caffe.TEST)
    old = os.umask(0o027)
    try:
        net.Save(str(tmp_path / "a.caffemodel"))
        net.ToHDF5(str(tmp_path / "a.h5"))
    finally:
        os.umask(old)
    for name in ("a.caffemodel", "a.h5"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["a.caffemodel", "a.h5"]
