"""Data layer over LMDB/LevelDB: Caffe's record order, wrap-around, transforms, encoded and float Datums,
prefetching, sharding by solver rank, fidelity to BVLC Caffe, and bad input."""
import gc
import io
import pathlib
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.blob import Blob, context
from caffe.blob.proto_io import array_to_blob_proto
from caffe.layers import LayerError, db
from caffe.layers.data_transformer import array_to_datum
from caffe.layers.testing import make_layer
from caffe.proto import caffe_pb2

SHARED = pathlib.Path(__file__).resolve().parents[3].parent / "shared"
REF = SHARED / "reference" / "lenet"


def write_images(path, images, labels, backend="lmdb", keys=None):
    keys = keys or [f"{i:08d}" for i in range(len(images))]
    db.write_db(str(path), ((k, array_to_datum(im, int(lb)).SerializeToString())
                            for k, im, lb in zip(keys, images, labels)), backend)
    return str(path)


def db_value(src, i):
    with db.open_db(src) as d:
        return caffe_pb2.Datum.FromString(dict(d.items())[f"{i:08d}".encode()])


def data_layer(source, batch, extra="", backend="LMDB", phase=0, prefetch=4):
    return make_layer("Data", f'data_param {{ source: "{source}" batch_size: {batch} backend: {backend} '
                              f'prefetch: {prefetch} }} {extra}', phase=phase)


def setup(layer, ntop=2):
    top = [Blob() for _ in range(ntop)]
    layer.SetUp([], top)
    return top


def forward(layer, top):
    layer.Forward([], top)
    return [t.data.copy() for t in top]


def test_fidelity_with_bvlc_caffe_digits(tmp_path):
    """lenet_digits_train_test's Data layer (scale 1/256, batch 64) yields exactly what BVLC Caffe did."""
    if not (REF / "train100" / "data_iter0.npy").exists():
        pytest.skip("shared/reference/lenet is absent: no BVLC Caffe reference outputs to compare with")
    digits = np.load(REF / "data" / "digits_28x28_uint8.npy")
    labels = np.load(REF / "data" / "digits_labels.npy")
    src = write_images(tmp_path / "digits_train_lmdb", digits[:1500, None], labels[:1500])
    layer = data_layer(src, 64, "transform_param { scale: 0.00390625 }")
    top = setup(layer)
    data0, _ = forward(layer, top)
    np.testing.assert_array_equal(data0, np.load(REF / "train100" / "data_iter0.npy"))
    want_labels = np.load(REF / "train100" / "labels_per_iter.npy")
    got = [top[1].data.copy()]
    for _ in range(99):
        got.append(forward(layer, top)[1])
    np.testing.assert_array_equal(np.stack(got), want_labels)  # wraps at 1500 like Caffe
    assert top[0].dtype == np.float32 and top[0].shape == (64, 1, 28, 28) and top[1].shape == (64,)


@pytest.mark.parametrize("backend", ["LMDB", "LEVELDB"])
def test_key_order_and_wrap_around(tmp_path, backend):
    if backend == "LEVELDB":
        pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    n = 7
    imgs = np.arange(n, dtype=np.uint8).repeat(6).reshape(n, 1, 2, 3)
    keys = [f"k{i:02d}" for i in range(n)]
    order = [3, 0, 6, 1, 5, 2, 4]  # written out of order
    src = write_images(tmp_path / "db", imgs[order], np.array(order) * 10, backend.lower(), [keys[i] for i in order])
    layer = data_layer(src, 3, backend=backend)
    top = setup(layer)
    stream = []
    for _ in range(5):
        d, lab = forward(layer, top)
        stream += list(lab)
        assert np.array_equal(d[:, 0, 0, 0], lab / 10)
    assert stream == [(i % n) * 10 for i in range(15)]


def test_single_top_and_float_data(tmp_path):
    arrs = np.random.default_rng(0).normal(size=(4, 2, 3, 3)).astype(np.float32)
    src = write_images(tmp_path / "db", arrs, range(4))
    layer = data_layer(src, 4, "transform_param { scale: 2 mean_value: 1 mean_value: -1 }")
    top = setup(layer, 1)
    (d,) = forward(layer, top)
    want = (arrs - np.array([1, -1], np.float32)[:, None, None]) * np.float32(2)
    np.testing.assert_array_equal(d, want)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_encoded_records(tmp_path, fmt):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(1)
    rgb = [rng.integers(0, 256, size=(8, 10, 3)).astype(np.uint8) for _ in range(5)]
    recs = []
    for i, a in enumerate(rgb):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format=fmt)
        recs.append((f"{i:08d}", caffe_pb2.Datum(encoded=True, data=buf.getvalue(), label=i).SerializeToString()))
    src = str(tmp_path / "enc_db")
    db.write_db(src, recs)
    layer = data_layer(src, 5, "transform_param { crop_size: 6 }", phase=1)
    top = setup(layer)
    d, lab = forward(layer, top)
    assert d.shape == (5, 3, 6, 6) and list(lab) == [0, 1, 2, 3, 4]
    for i, a in enumerate(rgb):
        if fmt == "JPEG":  # lossy: compare with what Pillow itself decodes
            a = np.asarray(Image.open(io.BytesIO(db_value(src, i).data)).convert("RGB"))
        want = a[1:7, 2:8, ::-1].transpose(2, 0, 1).astype(np.float32)  # centered crop, BGR
        np.testing.assert_array_equal(d[i], want)


def test_mirror_crop_reproducible_under_seed(tmp_path):
    imgs = np.random.default_rng(2).integers(0, 256, size=(10, 3, 9, 9)).astype(np.uint8)
    src = write_images(tmp_path / "db", imgs, range(10))
    runs = []
    for seed in (7, 7, 8):
        context.set_random_seed(seed)
        layer = data_layer(src, 5, "transform_param { crop_size: 5 mirror: true }")
        top = setup(layer)
        runs.append(np.concatenate([forward(layer, top)[0] for _ in range(4)]))
        layer.close()
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    # every item is some crop, maybe mirrored, of its source image
    for i, item in enumerate(runs[0]):
        src_img = imgs[i % 10].astype(np.float32)
        cands = [src_img[:, h:h + 5, w:w + 5] for h in range(5) for w in range(5)]
        assert any(np.array_equal(item, c) or np.array_equal(item, c[..., ::-1]) for c in cands)


@settings(max_examples=6)
@given(n_ranks=st.integers(1, 4), batch=st.integers(1, 5), records=st.integers(3, 11))
def test_ranks_share_the_stream_like_one_big_batch(tmp_path_factory, n_ranks, batch, records):
    """N ranks of batch b see exactly what one rank of batch N*b sees (Caffe's Skip())."""
    src = write_images(tmp_path_factory.mktemp("shard") / "db", np.zeros((records, 1, 1, 1), np.uint8),
                       range(records))
    try:
        context.set_solver_count(1)
        context.set_solver_rank(0)
        big = data_layer(src, n_ranks * batch, prefetch=1)
        top = setup(big)
        want = [forward(big, top)[1] for _ in range(3)]
        big.close()
        per_rank = []
        context.set_solver_count(n_ranks)
        for r in range(n_ranks):
            context.set_solver_rank(r)
            layer = data_layer(src, batch, prefetch=2)
            t = setup(layer)
            per_rank.append([forward(layer, t)[1] for _ in range(3)])
            layer.close()
        for it in range(3):
            got = np.stack([per_rank[r][it] for r in range(n_ranks)], axis=1).ravel()  # interleave ranks
            np.testing.assert_array_equal(got, want[it])
    finally:
        context.set_solver_count(1)
        context.set_solver_rank(0)


def test_test_phase_does_not_shard(tmp_path):
    src = write_images(tmp_path / "db", np.zeros((6, 1, 1, 1), np.uint8), range(6))
    try:
        context.set_solver_count(2)
        context.set_solver_rank(1)
        layer = data_layer(src, 6, phase=1)
        top = setup(layer)
        assert list(forward(layer, top)[1]) == [0, 1, 2, 3, 4, 5]
        layer.close()
    finally:
        context.set_solver_count(1)
        context.set_solver_rank(0)


def test_prefetch_fills_the_queue_in_the_background_and_stops_with_the_layer(tmp_path):
    src = write_images(tmp_path / "db", np.zeros((20, 1, 2, 2), np.uint8), range(20))
    layer = data_layer(src, 2, prefetch=3)
    top = setup(layer)
    deadline = time.time() + 10
    while layer._full.qsize() < 3 and time.time() < deadline:  # filled before any Forward asks
        time.sleep(0.01)
    assert layer._full.qsize() == 3
    thread = layer._thread
    assert thread.is_alive() and thread.daemon
    first = top[0]
    forward(layer, top)
    assert first.data_mem.own_cpu_data is False  # the top borrows the batch: no copy
    del layer
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_thread_carries_the_runtime_context(tmp_path):
    src = write_images(tmp_path / "db", np.zeros((4, 1, 1, 1), np.uint8), range(4))
    seen = {}
    layer = data_layer(src, 2)
    orig = type(layer).load_batch

    def spy(self, batch):
        seen.setdefault("state", (threading.current_thread().name, context.solver_count(), context.solver_rank()))
        return orig(self, batch)

    type(layer).load_batch = spy
    try:
        context.set_solver_count(3)
        context.set_solver_rank(2)
        top = setup(layer)
        forward(layer, top)
    finally:
        type(layer).load_batch = orig
        context.set_solver_count(1)
        context.set_solver_rank(0)
        layer.close()
    assert seen["state"] == ("caffe-prefetch-test", 3, 2)


# ---------------------------------------------------------------- bad input

def test_missing_and_empty_database(tmp_path):
    with pytest.raises(LayerError, match="Layer 'test' \\(Data\\): LMDB database '.*nope_lmdb' does not exist"):
        setup(data_layer(str(tmp_path / "nope_lmdb"), 2))
    empty = str(tmp_path / "empty_lmdb")
    db.write_db(empty, [])
    with pytest.raises(LayerError, match="LMDB database '.*empty_lmdb' holds no records"):
        setup(data_layer(empty, 2))
    with pytest.raises(LayerError, match="batch_size must be positive"):
        setup(data_layer(empty, 0))


def test_leveldb_without_plyvel_names_the_extra(tmp_path, monkeypatch):
    import sys
    (tmp_path / "ldb").mkdir()
    (tmp_path / "ldb" / "CURRENT").write_text("MANIFEST-000001\n")
    monkeypatch.setitem(sys.modules, "plyvel", None)
    with pytest.raises(LayerError, match=r"caffe-layers\[leveldb\]"):
        setup(data_layer(str(tmp_path / "ldb"), 1, backend="LEVELDB"))


def test_datum_size_disagreeing_with_the_first_record(tmp_path):
    imgs = [np.zeros((1, 4, 4), np.uint8)] * 3 + [np.zeros((1, 4, 5), np.uint8)]
    src = write_images(tmp_path / "db", imgs, range(4))
    layer = data_layer(src, 4)
    top = setup(layer)
    with pytest.raises(LayerError, match=r"record '00000003' of LMDB '.*db' is 1x4x5 but the batch holds 1x4x4"):
        forward(layer, top)
    with pytest.raises(LayerError):  # and it keeps failing, never hangs
        forward(layer, top)


def test_corrupt_record_is_named(tmp_path):
    good = array_to_datum(np.zeros((1, 2, 2), np.uint8), 0).SerializeToString()
    src = str(tmp_path / "db")
    db.write_db(src, [("a", good), ("b", b"\x0a\xff\xff\xff\x0f")])
    layer = data_layer(src, 2)
    top = setup(layer)
    with pytest.raises(LayerError, match="record 'b' of LMDB '.*db' is not a valid serialized Datum"):
        forward(layer, top)


def test_mean_file_of_wrong_shape(tmp_path):
    src = write_images(tmp_path / "db", np.zeros((2, 1, 4, 4), np.uint8), range(2))
    mean = tmp_path / "mean.binaryproto"
    mean.write_bytes(array_to_blob_proto(np.zeros((1, 3, 4, 4), np.float32)).SerializeToString())
    with pytest.raises(LayerError, match="mean_file '.*mean.binaryproto' holds a 3x4x4 mean but record "
                                         "'00000000' of LMDB '.*db' is 1x4x4"):
        setup(data_layer(src, 2, f'transform_param {{ mean_file: "{mean}" }}'))


def test_undecodable_encoded_record(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    src = str(tmp_path / "db")
    db.write_db(src, [("00000000", caffe_pb2.Datum(encoded=True, data=b"garbage").SerializeToString())])
    with pytest.raises(LayerError, match="record '00000000' of LMDB '.*db': cannot decode the encoded image"):
        setup(data_layer(src, 1))
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, format="PNG")
    good = caffe_pb2.Datum(encoded=True, data=buf.getvalue()).SerializeToString()
    cut = caffe_pb2.Datum(encoded=True, data=buf.getvalue()[:40]).SerializeToString()
    src2 = str(tmp_path / "db2")
    db.write_db(src2, [("a", good), ("b", good), ("c", cut)])  # a truncated PNG, decoded on the pool
    layer = data_layer(src2, 3)
    top = setup(layer)
    with pytest.raises(LayerError, match="record 'c' of LMDB '.*db2': cannot decode the encoded image"):
        forward(layer, top)


def test_two_layers_read_one_database_at_once(tmp_path):
    """Train and test nets (or solver threads) may read the same LMDB in one process."""
    src = write_images(tmp_path / "db", np.arange(5, dtype=np.uint8).reshape(5, 1, 1, 1), range(5))
    a, b = data_layer(src, 2), data_layer(src, 3, phase=1)
    ta, tb = setup(a), setup(b)
    assert list(forward(a, ta)[1]) == [0, 1] and list(forward(b, tb)[1]) == [0, 1, 2]
    a.close()
    assert list(forward(b, tb)[1]) == [3, 4, 0]
    b.close()
