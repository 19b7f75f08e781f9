"""DataTransformer: the vectorized batch transform equals Caffe's per-pixel loop; crops, mirrors,
means, scale; decoding; bad input."""
import copy
import io

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import context
from caffe.blob.proto_io import array_to_blob_proto
from caffe.layers.base_data import parallel_map
from caffe.layers.data_transformer import (DataError, DataTransformer, array_to_datum, datum_to_image,
                                           decode_image_bytes, load_mean_file, parse_datum)
from caffe.proto import caffe_pb2

PIL = pytest.importorskip("PIL.Image")


def tparam(**kw):
    p = caffe_pb2.TransformationParameter()
    for k, v in kw.items():
        if k == "mean_value":
            p.mean_value.extend(v)
        else:
            setattr(p, k, v)
    return p


def caffe_loop(img, mean, mean_values, scale, crop, mirror, h_off, w_off, dtype):
    """Caffe's DataTransformer::Transform, element by element (data_transformer.cpp)."""
    c_n, H, W = img.shape
    h_n = crop or H
    w_n = crop or W
    out = np.empty((c_n, h_n, w_n), dtype=dtype)
    s = dtype.type(np.float32(scale))  # the proto field is a float, whatever Dtype is
    for c in range(c_n):
        for h in range(h_n):
            for w in range(w_n):
                x = dtype.type(img[c, h_off + h, w_off + w])
                tw = w_n - 1 - w if mirror else w
                if mean is not None:
                    v = (x - dtype.type(mean[c, h_off + h, w_off + w])) * s
                elif mean_values is not None:
                    v = (x - dtype.type(mean_values[c if len(mean_values) > 1 else 0])) * s
                else:
                    v = x * s
                out[c, h, tw] = v
    return out


@given(n=st.integers(1, 3), c=st.sampled_from([1, 3]), h=st.integers(3, 7), w=st.integers(3, 7),
       crop=st.integers(0, 3), mirror=st.booleans(), phase=st.sampled_from([0, 1]),
       mean_kind=st.sampled_from(["none", "file", "one", "per_channel"]),
       scale=st.sampled_from([1.0, 0.00390625, 0.017]), as_float=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16), pooled=st.booleans())
def test_batch_transform_matches_caffe_loop(tmp_path_factory, n, c, h, w, crop, mirror, phase, mean_kind,
                                            scale, as_float, dtype, seed, pooled):
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, size=(n, c, h, w)).astype(np.uint8)
    if as_float:
        imgs = (imgs.astype(np.float32) * np.float32(0.37))
    kw = dict(scale=scale, crop_size=crop, mirror=mirror)
    mean = mean_values = None
    if mean_kind == "file":
        mean = rng.uniform(0, 255, size=(c, h, w)).astype(np.float32)
        path = tmp_path_factory.mktemp("mean") / "mean.binaryproto"
        path.write_bytes(array_to_blob_proto(mean[None]).SerializeToString())
        kw["mean_file"] = str(path)
    elif mean_kind == "one":
        mean_values = [float(np.float32(rng.uniform(0, 200)))]
        kw["mean_value"] = mean_values
    elif mean_kind == "per_channel":
        mean_values = [float(np.float32(v)) for v in rng.uniform(0, 200, size=c)]
        kw["mean_value"] = mean_values
    context.set_random_seed(seed)
    tf = DataTransformer(tparam(**kw), phase)
    tf.init_rand()
    twin = copy.deepcopy(tf)
    draws = twin._draw([im.shape for im in imgs])
    out = np.full((n, c, crop or h, crop or w), np.nan, dtype=dtype)
    # the whole-batch path, the per-item path, and the per-item path on the thread pool
    tf.transform_batch(list(imgs) if seed % 2 else imgs, out, map_fn=parallel_map if pooled else None)
    dt = np.dtype(dtype)
    for i in range(n):
        want = caffe_loop(imgs[i], mean, mean_values, scale, crop, draws[0][i], draws[1][i], draws[2][i], dt)
        np.testing.assert_array_equal(out[i], want)


def test_crop_offsets_random_in_train_centered_in_test():
    img = np.arange(1 * 9 * 9, dtype=np.uint8).reshape(1, 9, 9)
    context.set_random_seed(3)
    train = DataTransformer(tparam(crop_size=4), 0)
    train.init_rand()
    seen = {tuple(train.transform(img)[0, 0, :1]) for _ in range(200)}
    assert len(seen) == 36  # all 6x6 offsets drawn
    test = DataTransformer(tparam(crop_size=4), 1)
    test.init_rand()
    np.testing.assert_array_equal(test.transform(img), img[:, 2:6, 2:6].astype(np.float32))


def test_mirror_flips_about_half_the_items_and_is_reproducible():
    imgs = np.random.default_rng(0).integers(0, 255, size=(400, 1, 2, 3)).astype(np.uint8)
    runs = []
    for _ in range(2):
        context.set_random_seed(11)
        tf = DataTransformer(tparam(mirror=True), 1)
        tf.init_rand()
        out = np.empty(imgs.shape, np.float32)
        tf.transform_batch(imgs, out)
        runs.append(out)
    np.testing.assert_array_equal(runs[0], runs[1])
    flipped = np.all(runs[0] == imgs[..., ::-1], axis=(1, 2, 3)) & ~np.all(imgs == imgs[..., ::-1], axis=(1, 2, 3))
    assert 150 < flipped.sum() < 250


def test_no_random_draw_without_mirror_or_train_crop():
    context.set_random_seed(5)
    before = context.rng().bit_generator.state
    DataTransformer(tparam(crop_size=2), 1).init_rand()
    assert context.rng().bit_generator.state == before
    DataTransformer(tparam(crop_size=2), 0).init_rand()
    assert context.rng().bit_generator.state != before


def test_mean_file_of_wrong_shape_is_named(tmp_path):
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(array_to_blob_proto(np.zeros((1, 3, 4, 4), np.float32)).SerializeToString())
    tf = DataTransformer(tparam(mean_file=str(path)), 0, name="Layer 'd' (Data)")
    with pytest.raises(DataError, match=r"mean_file '.*mean.binaryproto' holds a 3x4x4 mean but record 7 is 1x5x5"):
        tf.transform(np.zeros((1, 5, 5), np.uint8), where="record 7")


def test_mean_file_errors(tmp_path):
    with pytest.raises(DataError, match="cannot read mean_file '.*nope.binaryproto'"):
        DataTransformer(tparam(mean_file=str(tmp_path / "nope.binaryproto")), 0)
    bad = tmp_path / "bad.binaryproto"
    bad.write_bytes(b"\xff\xff\xff")
    with pytest.raises(DataError, match="is not a valid BlobProto"):
        DataTransformer(tparam(mean_file=str(bad)), 0)
    good = tmp_path / "m.binaryproto"
    good.write_bytes(array_to_blob_proto(np.ones((1, 1, 2, 2), np.float32)).SerializeToString())
    with pytest.raises(DataError, match="mean_file and mean_value at the same time"):
        DataTransformer(tparam(mean_file=str(good), mean_value=[1.0]), 0)
    assert load_mean_file(str(good)).shape == (1, 2, 2)


def test_legacy_4d_mean_blob_and_mean_value_count():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=1)
    proto.data.extend([1.0, 2.0])
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.binaryproto")
        with open(p, "wb") as f:
            f.write(proto.SerializeToString())
        tf = DataTransformer(tparam(mean_file=p), 1)
        np.testing.assert_array_equal(tf.transform(np.full((2, 1, 1), 5, np.uint8)).ravel(), [4, 3])
    tf = DataTransformer(tparam(mean_value=[1, 2]), 1)
    with pytest.raises(DataError, match="either 1 mean_value or as many as channels \\(3\\)"):
        tf.transform(np.zeros((3, 2, 2), np.uint8))


def test_crop_larger_than_image_and_force_both():
    tf = DataTransformer(tparam(crop_size=5), 1, name="L")
    with pytest.raises(DataError, match="4x4, smaller than crop_size 5"):
        tf.transform(np.zeros((1, 4, 4), np.uint8), where="record x")
    with pytest.raises(DataError, match="both force_color and force_gray"):
        DataTransformer(tparam(force_color=True, force_gray=True), 0)


def test_size_mismatch_inside_a_batch_names_the_item():
    tf = DataTransformer(tparam(), 1, name="L")
    out = np.empty((2, 1, 3, 3), np.float32)
    with pytest.raises(DataError, match="record b is 1x3x4 but the batch holds 1x3x3"):
        tf.transform_batch([np.zeros((1, 3, 3), np.uint8), np.zeros((1, 3, 4), np.uint8)], out,
                           where=lambda i: "record " + "ab"[i])


def _png(arr, mode):
    buf = io.BytesIO()
    PIL.fromarray(arr, mode).save(buf, format="PNG")
    return buf.getvalue()


def test_decode_png_color_is_bgr_and_gray_is_one_channel():
    rgb = np.random.default_rng(1).integers(0, 256, size=(5, 7, 3)).astype(np.uint8)
    chw = decode_image_bytes(_png(rgb, "RGB"))
    np.testing.assert_array_equal(chw, rgb[:, :, ::-1].transpose(2, 0, 1))
    gray = rgb[:, :, 0].copy()
    np.testing.assert_array_equal(decode_image_bytes(_png(gray, "L")), gray[None])
    col = decode_image_bytes(_png(gray, "L"), force_color=True)
    assert col.shape == (3, 5, 7) and np.array_equal(col[0], gray) and np.array_equal(col[2], gray)
    assert decode_image_bytes(_png(rgb, "RGB"), force_gray=True).shape == (1, 5, 7)
    rgba = np.concatenate([rgb, np.full((5, 7, 1), 9, np.uint8)], axis=2)
    np.testing.assert_array_equal(decode_image_bytes(_png(rgba, "RGBA")), rgb[:, :, ::-1].transpose(2, 0, 1))


def test_encoded_datum_transforms_like_its_raw_twin():
    rgb = np.random.default_rng(2).integers(0, 256, size=(6, 6, 3)).astype(np.uint8)
    enc = caffe_pb2.Datum(encoded=True, data=_png(rgb, "RGB"), label=3)
    raw = array_to_datum(rgb[:, :, ::-1].transpose(2, 0, 1), 3)
    tf = DataTransformer(tparam(scale=0.5, mean_value=[10, 20, 30], crop_size=4), 1)
    np.testing.assert_array_equal(tf.transform(enc), tf.transform(raw))


def test_undecodable_image_is_named():
    with pytest.raises(DataError, match="record '00000003'.*cannot decode the encoded image"):
        datum_to_image(caffe_pb2.Datum(encoded=True, data=b"not an image"), where="record '00000003'")


def test_datum_data_size_disagreeing_with_its_shape():
    d = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(DataError, match="holds 3 bytes of data but its shape 1x2x2 needs 4"):
        datum_to_image(d)
    d = caffe_pb2.Datum(channels=1, height=2, width=1)
    d.float_data.extend([1.0])
    with pytest.raises(DataError, match="1 float_data values but its shape 1x2x1 needs 2"):
        datum_to_image(d)


def test_float_data_datum_round_trip_and_corrupt_record():
    arr = np.random.default_rng(4).normal(size=(2, 3, 4)).astype(np.float32)
    d = parse_datum(array_to_datum(arr, 5).SerializeToString())
    np.testing.assert_array_equal(datum_to_image(d), arr)
    assert d.label == 5
    with pytest.raises(DataError, match="record 'k' is not a valid serialized Datum"):
        parse_datum(b"\x08\x96\x01\x12\xff\xff", "record 'k'")
