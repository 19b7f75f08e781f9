"""pycaffe's caffe.io: BlobProto / Datum conversions, Transformer, resize_image, oversample, load_image."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import caffe
from caffe.proto import caffe_pb2

io = caffe.io


@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4),
                  elements=st.floats(-1e6, 1e6, width=32)))
def test_blobproto_roundtrip(arr):
    proto = io.array_to_blobproto(arr, diff=arr * 2)
    assert list(proto.shape.dim) == list(arr.shape)
    np.testing.assert_array_equal(io.blobproto_to_array(proto), arr)
    np.testing.assert_array_equal(io.blobproto_to_array(proto, return_diff=True), arr * 2)


def test_legacy_4d_blobproto_and_vectors():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=2, data=[1, 2, 3, 4])
    np.testing.assert_array_equal(io.blobproto_to_array(proto), np.arange(1, 5).reshape(1, 2, 1, 2))
    arrays = [np.ones((2, 3), np.float32), np.arange(4, dtype=np.float32)]
    back = io.blobprotovector_str_to_arraylist(io.arraylist_to_blobprotovector_str(arrays))
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="diff shape"):
        io.array_to_blobproto(np.ones(3), diff=np.ones(4))


def test_datum_roundtrip():
    img = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = io.array_to_datum(img, label=7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 7) and len(datum.data) == 24
    np.testing.assert_array_equal(io.datum_to_array(datum), img)
    f = io.array_to_datum(img.astype(np.float64) / 3)
    assert not len(f.data) and len(f.float_data) == 24 and not f.HasField("label")
    np.testing.assert_allclose(io.datum_to_array(f), img / 3, rtol=1e-6)
    with pytest.raises(ValueError, match="Incorrect array shape"):
        io.array_to_datum(np.zeros((2, 2)))


def test_transformer_preprocess_and_deprocess():
    t = io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    mean = np.array([10.0, 20.0, 30.0])
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.5)
    img = np.random.default_rng(0).random((4, 5, 3)).astype(np.float32)
    x = t.preprocess("data", img)
    expected = (img.transpose(2, 0, 1)[[2, 1, 0]] * 255 - mean[:, None, None]) * 0.5
    assert x.shape == (3, 4, 5) and x.dtype == np.float32
    np.testing.assert_allclose(x, expected, rtol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", x), img, rtol=1e-5, atol=1e-6)
    assert t.preprocess("data", np.ones((8, 10, 3), np.float32)).shape == (3, 4, 5)  # resized first


def test_transformer_checks():
    t = io.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(KeyError, match="nope is not one of the net inputs"):
        t.set_raw_scale("nope", 1)
    with pytest.raises(ValueError, match="Transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(ValueError, match="Channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="Mean channels incompatible"):
        t.set_mean("data", np.zeros(4))
    with pytest.raises(ValueError, match="Mean shape incompatible"):
        t.set_mean("data", np.zeros((2, 4, 5)))  # channels must match; height and width are resized
    with pytest.raises(ValueError, match="Mean shape incompatible"):
        t.set_mean("data", np.zeros((4, 5)))  # as pycaffe: an H x W mean only for one channel
    t.set_mean("data", np.zeros((3, 4, 5)))
    gray = io.Transformer({"g": (1, 1, 4, 5)})
    gray.set_transpose("g", (2, 0, 1))
    gray.set_mean("g", np.ones((4, 5)))
    np.testing.assert_allclose(gray.preprocess("g", np.full((4, 5, 1), 3.0)), np.full((1, 4, 5), 2.0))


def test_resize_image():
    img = np.arange(12, dtype=np.float32).reshape(3, 4, 1)
    same = io.resize_image(img, (3, 4))
    np.testing.assert_allclose(same, img)
    up = io.resize_image(np.array([[0.0, 1.0]], np.float32)[:, :, None], (1, 4))
    np.testing.assert_allclose(up[0, :, 0], [0, 0.25, 0.75, 1])  # pixel-center bilinear, edges clamped
    near = io.resize_image(img, (6, 8), interp_order=0)
    np.testing.assert_array_equal(near[::2, ::2], img)
    const = io.resize_image(np.full((2, 2, 3), 0.5), (5, 7))
    assert const.shape == (5, 7, 3) and np.all(const == 0.5) and const.dtype == np.float32
    with pytest.raises(ValueError, match="interp_order"):
        io.resize_image(img, (2, 2), interp_order=3)


def test_oversample():
    img = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    crops = io.oversample([img, img + 100], (2, 3))
    assert crops.shape == (20, 2, 3, 2)
    np.testing.assert_array_equal(crops[0], img[:2, :3])      # top-left
    np.testing.assert_array_equal(crops[3], img[2:, 2:])      # bottom-right
    np.testing.assert_array_equal(crops[4], img[1:3, 1:4])    # center
    np.testing.assert_array_equal(crops[5], img[:2, :3][:, ::-1])  # mirrored top-left
    np.testing.assert_array_equal(crops[14], img[1:3, 1:4] + 100)
    np.testing.assert_array_equal(crops[19], img[1:3, 1:4][:, ::-1] + 100)


def test_load_image(tmp_path):
    try:
        from PIL import Image
    except ImportError:
        with pytest.raises(ImportError, match=r"load_image\('x.png'\) needs Pillow"):
            io.load_image("x.png")
        return
    arr = (np.arange(2 * 3 * 3) * 9).astype(np.uint8).reshape(2, 3, 3)
    Image.fromarray(arr).save(tmp_path / "i.png")
    color = io.load_image(str(tmp_path / "i.png"))
    assert color.shape == (2, 3, 3) and color.dtype == np.float32
    np.testing.assert_allclose(color, arr / 255.0, rtol=1e-6)
    assert io.load_image(str(tmp_path / "i.png"), color=False).shape == (2, 3, 1)
