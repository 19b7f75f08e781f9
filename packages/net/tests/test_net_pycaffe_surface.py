"""pycaffe's names beyond Net itself: `from caffe import layers as L` (NetSpec builders) beside the
layer-implementation package, nets built from NetSpec, what a fresh `import caffe` offers, every
snake_case method of pycaffe's Net, the Transformer's mean resizing, and caffe.Detector."""
import subprocess
import sys

import numpy as np
import pytest

import caffe
from caffe import layers as L, params as P
from caffe.net.testing import input_layer, python_layer
from caffe.proto import caffe_pb2

# the methods and properties pycaffe's Net has (_caffe.cpp's bindings and pycaffe.py's additions)
PYCAFFE_NET = ("_forward _backward reshape clear_param_diffs copy_from share_with _blob_loss_weights _bottom_ids "
               "_top_ids _blobs layers _blob_names _layer_names _inputs _outputs _set_input_arrays save save_hdf5 "
               "load_hdf5 before_forward after_forward before_backward after_backward blobs blob_loss_weights "
               "layer_dict params forward backward forward_all forward_backward_all set_input_arrays _batch "
               "inputs outputs top_names bottom_names").split()


def write(tmp_path, proto, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(str(proto))
    return str(path)


def test_layers_package_is_also_the_netspec_builder():
    import caffe.layers
    assert L is caffe.layers and L is sys.modules["caffe.layers"]
    top = L.Convolution(L.Input(shape=dict(dim=[1, 1, 5, 5])), kernel_size=3, num_output=2)
    assert top.fn.type_name == "Convolution"
    from caffe.layers import convolution, testing  # the implementation modules import as before
    assert convolution.__name__ == "caffe.layers.convolution" and testing.__name__ == "caffe.layers.testing"
    assert callable(caffe.layers.create_layer) and caffe.layers.layer_type_list is not None
    with pytest.raises(AttributeError, match="capital first letter"):
        caffe.layers.not_a_module
    # every layer type, and every type with a parameter message, is a builder under caffe.layers
    names = set(caffe.layer_type_list()) | {f.message_type.name[:-len("Parameter")]
                                            for f in caffe_pb2.LayerParameter.DESCRIPTOR.fields
                                            if f.name.endswith("_param") and f.message_type}
    for name in sorted(names):
        fn = getattr(caffe.layers, name)(ntop=1).fn
        assert fn.type_name == name, name


def test_fresh_import_offers_pycaffes_names():
    code = ("import caffe\n"
            "types = caffe.layer_type_list()\n"
            "assert {'RNN', 'LSTM', 'Python', 'Data', 'Convolution', 'InnerProduct'} <= set(types), types\n"
            "assert types == sorted(types)\n"
            "b = caffe.proto.caffe_pb2.BlobProto()\n"
            "import caffe.io\n"
            "from caffe.io import Transformer, load_image\n"
            "import caffe.net.io\n"
            "assert caffe.io is caffe.net.io\n"
            "from caffe import layers as L, params as P\n"
            "assert L.Pooling and P.Pooling.MAX == 0\n"
            "assert isinstance(caffe.__version__, str) and caffe.__version__[0].isdigit()\n"
            "t = caffe.Timer(); t.start(); t.stop(); assert t.ms >= 0\n"
            "for name in ('init_log', 'log', 'NetSpec', 'to_proto', 'Net', 'Classifier', 'Detector', 'TRAIN', 'TEST',\n"
            "             'set_mode_cpu', 'set_mode_gpu', 'set_device', 'set_random_seed', 'Layer', 'coord_map', 'draw'):\n"
            "    getattr(caffe, name)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def lenet(batch, anonymous=False):
    n = caffe.NetSpec()
    data, label = L.DummyData(shape=[dict(dim=[batch, 1, 28, 28]), dict(dim=[batch, 1, 1, 1])],
                              data_filler=[dict(type="gaussian", std=50), dict(type="constant", value=1)],
                              transform_param=dict(scale=1. / 255), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=4, weight_filler=dict(type="xavier"))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool1, num_output=8, weight_filler=dict(type="xavier"))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type="xavier"))
    loss = L.SoftmaxWithLoss(ip2, label)
    if anonymous:
        return loss.to_proto()
    n.data, n.label, n.conv1, n.pool1, n.ip1, n.relu1, n.ip2, n.loss = data, label, conv1, pool1, ip1, relu1, ip2, loss
    return n.to_proto()


@pytest.mark.parametrize("anonymous", [False, True])
def test_netspec_nets_build_and_run(tmp_path, anonymous):
    # Seeded: DummyData's std-50 gaussian makes logits of ~100, and about one draw in 150 saturated the softmax
    # to p = 1 for all four images, a loss of exactly 0 (as in Caffe), which failed `loss > 0` at random.
    caffe.set_random_seed(1701)
    proto = lenet(4, anonymous)
    assert proto.layer[4].bottom == proto.layer[4].top  # the in-place ReLU
    net = caffe.Net(write(tmp_path, proto), caffe.TRAIN)
    assert len(net.layers) == 7 and net.outputs == [proto.layer[-1].top[0]]
    loss = net.forward()[net.outputs[0]]
    assert np.isfinite(loss) and loss > 0
    # a net of top-less layers: nothing to return
    n = caffe.NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    assert caffe.Net(write(tmp_path, n.to_proto(), "silent.prototxt"), caffe.TEST).forward() == {}


def test_pycaffe_net_methods(tmp_path):
    net = caffe.Net(write(tmp_path, lenet(2)), caffe.TRAIN)
    missing = [m for m in PYCAFFE_NET if not hasattr(net, m)]
    assert not missing, missing
    for layer in net.layers:
        assert hasattr(layer, "blobs") and hasattr(layer, "reshape") and isinstance(layer.type, str)
    blob = net.blobs["data"]
    assert (blob.num, blob.channels, blob.height, blob.width) == (2, 1, 28, 28) and blob.count == 2 * 28 * 28
    net.forward()
    net.backward()
    diff = net.params["conv1"][0].diff
    assert np.abs(diff).max() > 0
    net.clear_param_diffs()
    assert not diff.any()  # zeroed in place: views taken before still see it


def test_set_mean_resizes_a_larger_mean():
    t = caffe.io.Transformer({"data": (1, 3, 8, 8)})
    t.set_transpose("data", (2, 0, 1))
    ramp = np.linspace(0, 90, 10, dtype=np.float32)
    mean = np.stack([np.tile(ramp, (10, 1)) + 100 * c for c in range(3)])  # 3 x 10 x 10, per-channel ramps
    t.set_mean("data", mean)
    m = t.mean["data"]
    assert m.shape == (3, 8, 8)
    expected = caffe.io.resize_image(mean.transpose(1, 2, 0), (8, 8)).transpose(2, 0, 1)
    np.testing.assert_allclose(m, expected, rtol=1e-6)
    assert np.all(np.diff(m[0, 0]) > 0) and m.min() >= 0 and m.max() <= 290  # still a ramp, within range
    t.set_mean("data", np.full((3, 256, 256), 7.0))  # an ImageNet-sized mean for a small input
    np.testing.assert_allclose(t.mean["data"], 7.0)
    np.testing.assert_allclose(t.preprocess("data", np.full((8, 8, 3), 10.0, np.float32)), 3.0)
    t.set_mean("data", np.ones((3, 4, 4)))  # smaller: resized up
    assert t.mean["data"].shape == (3, 8, 8)
    with pytest.raises(ValueError, match="channel"):
        t.set_mean("data", np.ones((1, 10, 10)))


@pytest.fixture
def classify_net(tmp_path):
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text("\n".join([input_layer("input", {"data": (2, 3, 8, 8)}),
                                 python_layer("scale", "ChannelScale", ["data"], ["s"], param_str="0.5"),
                                 'layer { name: "prob" type: "Softmax" bottom: "s" top: "prob" }']))
    weights = str(tmp_path / "w.caffemodel")
    caffe.Net(str(deploy), caffe.TEST).save(weights)
    return str(deploy), weights


def test_classifier_with_an_imagenet_style_mean(classify_net):
    deploy, weights = classify_net  # classify.py passes a mean larger than the input
    clf = caffe.Classifier(deploy, weights, image_dims=(10, 10), mean=np.full((3, 12, 12), 0.25),
                           raw_scale=1.0, channel_swap=(2, 1, 0))
    images = [np.random.default_rng(0).random((9, 11, 3)).astype(np.float32)]
    assert clf.predict(images, oversample=False).shape == (1, 3, 8, 8)


def test_detector_windows(classify_net, tmp_path):
    from PIL import Image
    deploy, weights = classify_net
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    path = str(tmp_path / "img.png")
    Image.fromarray(pixels).save(path)
    mean = np.array([0.1, 0.2, 0.3])
    det = caffe.Detector(deploy, weights, mean=mean, raw_scale=1.0, channel_swap=(2, 1, 0))
    windows = [np.array([2, 3, 12, 15]), np.array([0, 0, 20, 24]), np.array([5, 5, 9, 9])]
    dets = det.detect_windows([(path, windows[:2]), (path, windows[2:])])
    assert [d["filename"] for d in dets] == [path] * 3 and [d["window"] is w for d, w in zip(dets, windows)]
    image = caffe.io.load_image(path)
    for d, (y0, x0, y1, x1) in zip(dets, windows):  # each prediction is the net on the warped window
        x = det.transformer.preprocess("data", image[y0:y1, x0:x1])
        s = 0.5 * x
        e = np.exp(s - s.max(0))
        np.testing.assert_allclose(d["prediction"], e / e.sum(0), rtol=1e-5)
    # with context: the window grows by the margin; what falls outside the image is the (raw) mean
    ctx = caffe.Detector(deploy, weights, mean=mean, raw_scale=2.0, channel_swap=(2, 1, 0), context_pad=2)
    assert list(ctx.crop_dims) == [8, 8, 3]
    np.testing.assert_allclose(ctx.crop_mean.reshape(-1), mean[::-1] / 2.0)  # back to RGB, unscaled
    crop = ctx.crop(image, np.array([0, 0, 6, 6]))  # at the corner: context off the image is mean-filled
    assert crop.shape == (8, 8, 3)
    np.testing.assert_allclose(crop[0, 0], mean[::-1] / 2.0, rtol=1e-6)
    inner = ctx.crop(image, np.array([6, 6, 12, 12]))  # inside: all image content
    assert inner.shape == (8, 8, 3) and inner.min() >= 0 and inner.max() <= 1
    assert len(ctx.detect_windows([(path, [np.array([0, 0, 6, 6])])])) == 1
    with pytest.raises(RuntimeError, match="selective_search_ijcv_with_python"):
        det.detect_selective_search([path])
