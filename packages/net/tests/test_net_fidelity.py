"""Fidelity against real BVLC Caffe (../shared/reference/lenet) and Caffe's own example nets
(../shared/caffe-models).

Relative error here is max|ours - caffe| / max|caffe| per blob. Tests skip, saying why, when the shared
data is absent or when a layer type they need is not implemented yet in caffe-layers.
"""
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

import caffe
from caffe.layers import layer_type_list
from caffe.net import FilterNet
from caffe.net.upgrade import ReadNetParamsFromTextFileOrDie
from caffe.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[3].parent / "shared"
LENET = SHARED / "reference" / "lenet"
MODELS = SHARED / "caffe-models"


def require(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"shared reference data absent: {path}")


def require_layers(*type_names) -> None:
    missing = sorted(set(type_names) - set(layer_type_list()))
    if missing:
        pytest.skip(f"layer type(s) not implemented yet in caffe-layers: {', '.join(missing)}")


def rel_error(got, ref) -> float:
    scale = float(np.abs(ref).max()) if np.size(ref) else 0.0
    return float(np.abs(np.asarray(got, np.float64) - ref).max()) / (scale or 1.0)


# -- LeNet against BVLC Caffe -----------------------------------------------------------------------

@pytest.mark.parametrize("it", [0, 100])
def test_lenet_forward_matches_caffe(it):
    require(LENET)
    require_layers("Convolution", "Pooling", "InnerProduct", "ReLU", "Softmax")
    net = caffe.Net(str(LENET / "lenet_deploy.prototxt"), caffe.TEST,
                    weights=str(LENET / f"lenet_iter_{it}.caffemodel"))
    ip1 = net.layer_names.index("ip1")
    captured = {}
    net.after_forward(lambda i: captured.setdefault("ip1_prerelu", net.blobs["ip1"].data.copy()) if i == ip1
                      else None)
    net.forward(data=np.load(LENET / "input_data.npy"))
    refs = {p.stem: np.load(p) for p in (LENET / f"forward_iter{it}").glob("*.npy")}
    assert set(refs) == set(net.blobs) | {"ip1_prerelu"}
    for name, blob in net.blobs.items():
        assert blob.shape == refs[name].shape, name
        assert rel_error(blob.data, refs[name]) <= 1e-5, f"{name}: {rel_error(blob.data, refs[name]):.3g}"
    assert rel_error(captured["ip1_prerelu"], refs["ip1_prerelu"]) <= 1e-5
    net.ForwardTo(ip1)  # the same blob, stopping before the in-place ReLU
    assert rel_error(net.blobs["ip1"].data, refs["ip1_prerelu"]) <= 1e-5


@pytest.mark.parametrize("it", [0, 100])
def test_lenet_backward_matches_caffe(it):
    require(LENET)
    require_layers("Convolution", "Pooling", "InnerProduct", "ReLU", "SoftmaxWithLoss")
    net = caffe.Net(str(LENET / "lenet_train_input.prototxt"), caffe.TRAIN,
                    weights=str(LENET / f"lenet_iter_{it}.caffemodel"))
    assert "accuracy" not in net.layer_names  # TEST-only layer filtered out
    net.blobs["data"].data[...] = np.load(LENET / "input_data.npy")
    net.blobs["label"].data[...] = np.load(LENET / "input_label.npy")
    net.ClearParamDiffs()
    loss = net.ForwardBackward()
    ref_dir = LENET / f"backward_iter{it}"
    ref_loss = np.load(ref_dir / "loss.npy").item()
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert abs(float(net.blobs["loss"].data) - ref_loss) <= 1e-4 * abs(ref_loss)
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for i, kind in enumerate("wb"):
            ref = np.load(ref_dir / f"{layer}_{kind}_diff.npy")
            got = net.params[layer][i].diff
            assert got.shape == ref.shape
            assert rel_error(got, ref) <= 1e-4, f"{layer}_{kind}_diff: {rel_error(got, ref):.3g}"


def test_lenet_weights_survive_our_caffemodel_and_hdf5(tmp_path):
    require(LENET)
    require_layers("Convolution", "Pooling", "InnerProduct", "ReLU", "Softmax")
    deploy = str(LENET / "lenet_deploy.prototxt")
    original = LENET / "lenet_iter_100.caffemodel"
    net = caffe.Net(deploy, caffe.TEST, weights=str(original))
    x = np.load(LENET / "input_data.npy")
    expected = net.forward(data=x)["prob"].copy()
    net.save(str(tmp_path / "again.caffemodel"))
    ours = caffe_pb2.NetParameter.FromString((tmp_path / "again.caffemodel").read_bytes())
    theirs = caffe_pb2.NetParameter.FromString(original.read_bytes())
    for layer in ours.layer:  # the same parameter values as Caffe's own snapshot
        match = [l for l in theirs.layer if l.name == layer.name]
        for a, b in zip(layer.blobs, match[0].blobs if match else []):
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    net.save_hdf5(str(tmp_path / "again.h5"))
    for path in ("again.caffemodel", "again.h5"):
        other = caffe.Net(deploy, caffe.TEST, weights=str(tmp_path / path))
        np.testing.assert_array_equal(other.forward(data=x)["prob"], expected)


# -- Caffe's example nets: every one loads in TRAIN and TEST, with Caffe's blob shapes ------------------

def example_prototxts():
    if not MODELS.is_dir():
        return []
    return sorted(p for p in MODELS.rglob("*.prototxt") if "solver" not in p.name)


DATA_TYPES = {"Data", "HDF5Data", "ImageData", "WindowData"}
# The datasets behind the examples' sources (C x H x W, or feature count), keyed by a source fragment.
DATASETS = [("siamese", (2, 28, 28)), ("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32)),
            ("ilsvrc12", (3, 256, 256)), ("hdf5_classification", (4,))]


def input_for(layer):
    """An Input layer standing in for a data layer whose source is absent (same name, tops, rules)."""
    sub = layer.hdf5_data_param if layer.type == "HDF5Data" else layer.data_param
    dims = next(d for key, d in DATASETS if key in sub.source)
    crop = layer.transform_param.crop_size
    if crop:
        dims = (dims[0], crop, crop)
    new = caffe_pb2.LayerParameter(name=layer.name, type="Input", top=layer.top)
    new.include.extend(layer.include)
    new.exclude.extend(layer.exclude)
    new.input_param.shape.add(dim=(sub.batch_size,) + tuple(dims))
    for _ in layer.top[1:]:
        new.input_param.shape.add(dim=[sub.batch_size])
    return new


def with_inputs(param):
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        out.layer.append(input_for(layer) if layer.type in DATA_TYPES else layer)
    return out


def _spatial(values, default, n):
    values = list(values) or [default]
    return values * n if len(values) == 1 else values


def expected_top_shapes(lp, bottoms):
    """Caffe's documented shape arithmetic, written independently of the layers (None: not checked)."""
    t = lp.type
    if t == "Input":
        return [tuple(s.dim) for s in lp.input_param.shape]
    if t == "DummyData":
        return [tuple(s.dim) for s in lp.dummy_data_param.shape]
    b = bottoms[0] if bottoms else None
    if t == "Convolution":
        p = lp.convolution_param
        n = len(b) - 2
        k, s = _spatial(p.kernel_size, 1, n), _spatial(p.stride, 1, n)
        pad, dil = _spatial(p.pad, 0, n), _spatial(p.dilation, 1, n)
        out = tuple((b[2 + i] + 2 * pad[i] - (dil[i] * (k[i] - 1) + 1)) // s[i] + 1 for i in range(n))
        return [(b[0], p.num_output) + out]
    if t == "Pooling":
        p = lp.pooling_param
        if p.global_pooling:
            return [b[:2] + (1, 1)]
        out = []
        for i in range(2):
            k = p.kernel_size or (p.kernel_h, p.kernel_w)[i]
            s = p.stride or 1
            size = math.ceil((b[2 + i] + 2 * p.pad - k) / s) + 1
            if p.pad and (size - 1) * s >= b[2 + i] + p.pad:
                size -= 1  # the last pooling window must start inside the image
            out.append(size)
        return [b[:2] + tuple(out)] * len(lp.top)
    if t == "InnerProduct":
        axis = lp.inner_product_param.axis % len(b)
        return [b[:axis] + (lp.inner_product_param.num_output,)]
    if t in ("ReLU", "Dropout", "LRN", "Sigmoid", "TanH", "Softmax", "Split"):
        return [b] * max(1, len(lp.top))
    if t == "Flatten":
        return [(b[0], int(np.prod(b[1:])))]
    if t == "Slice":
        p = lp.slice_param
        axis = p.slice_dim if p.HasField("slice_dim") else p.axis
        points = [0] + list(p.slice_point) + [b[axis]] if len(p.slice_point) else \
            [i * b[axis] // len(lp.top) for i in range(len(lp.top) + 1)]
        return [b[:axis] + (hi - lo,) + b[axis + 1:] for lo, hi in zip(points, points[1:])]
    if t in ("SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "ContrastiveLoss", "Accuracy"):
        return [()] * max(1, len(lp.top))
    return None


# Shapes that Caffe's documentation and logs give for these nets (batch dimension left out).
FACTS = {
    "bvlc_reference_caffenet": {"conv1": (96, 55, 55), "pool1": (96, 27, 27), "conv2": (256, 27, 27),
                                "pool2": (256, 13, 13), "conv5": (256, 13, 13), "pool5": (256, 6, 6),
                                "fc6": (4096,), "fc7": (4096,), "fc8": (1000,)},
    "lenet": {"conv1": (20, 24, 24), "pool1": (20, 12, 12), "conv2": (50, 8, 8), "pool2": (50, 4, 4),
              "ip1": (500,), "ip2": (10,)},
    "cifar10_quick": {"conv1": (32, 32, 32), "pool1": (32, 16, 16), "pool2": (32, 8, 8), "pool3": (64, 4, 4),
                      "ip1": (64,), "ip2": (10,)},
    "cifar10_full": {"pool1": (32, 16, 16), "pool2": (32, 8, 8), "pool3": (64, 4, 4), "ip1": (10,)},
    "mnist_siamese": {"pool2": (50, 4, 4), "feat": (2,)},
}
FACTS["bvlc_alexnet"] = FACTS["bvlc_reference_caffenet"]
BIG = ("bvlc_alexnet", "bvlc_reference_caffenet")


def facts_for(path: Path):
    for key, facts in FACTS.items():
        if key in str(path):
            return facts
    return {}


class _PyEuclideanLoss(caffe.Layer):
    """The Python loss layer Caffe's examples/pycaffe/layers/pyloss.py defines, for linreg.prototxt."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count() != bottom[1].count():
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff ** 2) / bottom[0].num / 2.

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if propagate_down[i]:
                sign = 1 if i == 0 else -1
                bottom[i].diff[...] = sign * self.diff / bottom[i].num


def stage_sets(param):
    stages = sorted({s for l in param.layer for r in list(l.include) + list(l.exclude) for s in r.stage})
    return [[s] for s in stages] or [[]]


@pytest.mark.parametrize("path", example_prototxts() or [None],
                         ids=lambda p: str(p.relative_to(MODELS)) if p else "absent")
@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST], ids=["TRAIN", "TEST"])
def test_example_nets_load_with_caffe_shapes(path, phase, monkeypatch):
    if path is None:
        pytest.skip(f"shared example nets absent: {MODELS}")
    monkeypatch.setitem(sys.modules, "pyloss", types.SimpleNamespace(EuclideanLossLayer=_PyEuclideanLoss))
    param = with_inputs(ReadNetParamsFromTextFileOrDie(path))
    for stages in stage_sets(param):
        param.state.CopyFrom(caffe_pb2.NetState(phase=phase, stage=stages))
        used = {l.type for l in FilterNet(param).layer} | {"Split"}
        require_layers(*used)
        net = caffe.Net(param)
        assert net.phase == phase
        shapes = {}
        for i, lp in enumerate(l.layer_param for l in net.layers):
            bottoms = [shapes[net.blob_names[j]] for j in net.bottom_id_vecs[i]]
            expected = expected_top_shapes(lp, bottoms)
            for k, j in enumerate(net.top_id_vecs[i]):
                name = net.blob_names[j]
                got = net.blobs[name].shape
                if expected is not None:
                    assert got == expected[k], f"{path.name} {lp.name} top {name}: {got} != {expected[k]}"
                shapes[name] = got
        for name, dims in facts_for(path).items():
            batch = net.blobs[net.inputs[0]].shape[0]
            assert net.blobs[name].shape == (batch,) + dims, f"{path.name}: {name}"
        has_loss = any(w for w in net.blob_loss_weights.values())
        if phase == caffe.TRAIN and has_loss and not any(key in str(path) for key in BIG):
            run_once(net)


def run_once(net):
    """One forward/backward of a net with a loss, with valid inputs: a finite loss, and gradients reach the
    parameters."""
    rng = np.random.default_rng(0)
    for name in net.inputs:
        blob = net.blobs[name]
        blob.data[...] = rng.random(blob.shape) if blob.num_axes > 1 else 0
    net.ClearParamDiffs()
    loss = net.ForwardBackward()
    assert np.isfinite(loss) and loss != 0
    assert any(np.abs(p.diff).sum() > 0 for p in net.learnable_params)


def test_example_nets_are_found():
    if not MODELS.is_dir():
        pytest.skip(f"shared example nets absent: {MODELS}")
    names = {p.name for p in example_prototxts()}
    assert {"train_val.prototxt", "deploy.prototxt", "lenet_train_test.prototxt", "linreg.prototxt"} <= names


def test_text_format_of_filtered_lenet_matches_caffe_layers():
    require(LENET)
    param = ReadNetParamsFromTextFileOrDie(LENET / "lenet_digits_train_test.prototxt")
    param.state.phase = caffe.TEST
    names = [l.name for l in FilterNet(param).layer]
    assert names[0] == "mnist" and "accuracy" in names and names.count("mnist") == 1
    assert text_format.MessageToString(FilterNet(param)).count("include") == 2  # the kept rules stay


@pytest.mark.gpu
def test_lenet_on_gpu_matches_caffe():
    from caffe.blob import context
    if not context.gpu_available():
        pytest.skip("no GPU (CuPy with a CUDA device) available")
    require(LENET)
    require_layers("Convolution", "Pooling", "InnerProduct", "ReLU", "SoftmaxWithLoss")
    caffe.set_mode_gpu()
    try:
        net = caffe.Net(str(LENET / "lenet_train_input.prototxt"), caffe.TRAIN,
                        weights=str(LENET / "lenet_iter_100.caffemodel"))
        net.blobs["data"].data[...] = np.load(LENET / "input_data.npy")
        net.blobs["label"].data[...] = np.load(LENET / "input_label.npy")
        net.ClearParamDiffs()
        loss = net.ForwardBackward()
        ref_dir = LENET / "backward_iter100"
        assert abs(loss - np.load(ref_dir / "loss.npy").item()) <= 1e-4 * abs(np.load(ref_dir / "loss.npy").item())
        for layer in ("conv1", "conv2", "ip1", "ip2"):
            for i, kind in enumerate("wb"):
                ref = np.load(ref_dir / f"{layer}_{kind}_diff.npy")
                assert rel_error(net.params[layer][i].diff, ref) <= 1e-4, f"{layer}_{kind}_diff"
    finally:
        caffe.set_mode_cpu()
