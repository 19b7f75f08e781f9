"""Mutation survivors of the data layers (docs/MUTATION.md, layers-10 and layers-14): DummyData's shared
filler and shape, its legacy fields one at a time; MemoryData's own API (add_mat_vector, add_datum_vector,
set_batch_size: what pycaffe's net.set_input_arrays and friends call), its errors naming the item at fault."""
import os

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from caffe.blob import Blob, context
from caffe.layers import LayerError
from caffe.layers.data_transformer import DataError, array_to_datum
from caffe.layers.testing import make_layer


# -- DummyData ------------------------------------------------------------------------------------

def test_dummy_data_one_filler_and_one_shape_serve_every_top():
    """Caffe: one data_filler (or one shape) is used for every top; a non-constant one refills each."""
    layer = make_layer("DummyData", """dummy_data_param { shape { dim: 2 dim: 3 }
        data_filler { type: "uniform" min: 1 max: 2 } }""")
    top = [Blob(), Blob(), Blob()]
    context.set_random_seed(3)
    layer.SetUp([], top)
    assert [t.shape for t in top] == [(2, 3)] * 3
    layer.Forward([], top)
    first = [t.data.copy() for t in top]
    for t in first:
        assert np.all((t >= 1) & (t <= 2))
    layer.Forward([], top)
    for a, t in zip(first, top):
        assert not np.array_equal(a, t.data)  # each top refilled by the one filler


@pytest.mark.parametrize("field", ["num", "channels", "height", "width"])
def test_dummy_data_any_one_legacy_field_makes_the_legacy_form(field):
    """Caffe's legacy check is num OR channels OR height OR width: any one of them alone asks for all four."""
    missing = "num" if field != "num" else "channels"
    with pytest.raises(LayerError, match=f"{missing} must be specified once, or once per top blob"):
        make_layer("DummyData", f"dummy_data_param {{ {field}: 2 }}").SetUp([], [Blob()])


def test_dummy_data_legacy_fields_per_top():
    layer = make_layer("DummyData", "dummy_data_param { num: 2 num: 1 channels: 3 height: 1 height: 2 "
                                    "width: 4 data_filler { value: 5 } }")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (2, 3, 1, 4) and top[1].shape == (1, 3, 2, 4)
    assert np.all(top[0].data == 5) and np.all(top[1].data == 5)


# -- MemoryData -----------------------------------------------------------------------------------

def memory_layer(b=2, c=1, h=2, w=3, extra="", name="mem"):
    layer = make_layer("MemoryData", f"memory_data_param {{ batch_size: {b} channels: {c} height: {h} "
                                     f"width: {w} }} {extra}", name=name)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    return layer, top


@given(b=st.integers(1, 3), k=st.integers(1, 3), c=st.integers(1, 3), h=st.integers(1, 3), w=st.integers(1, 3),
       scale=st.sampled_from([1.0, 0.5, 0.1]), mean=st.sampled_from([None, 1.0, 0.3]), uint8=st.booleans())
@example(b=2, k=2, c=2, h=3, w=3, scale=0.1, mean=0.3, uint8=True)  # float32 (x - mean) * scale, as Caffe: not float64
def test_add_mat_vector_transforms_and_serves_every_image(b, k, c, h, w, scale, mean, uint8):
    extra = f"transform_param {{ scale: {scale} {'' if mean is None else f'mean_value: {mean}'} }}"
    layer, top = memory_layer(b, c, h, w, extra)
    n = b * k
    rng = np.random.default_rng(n * 31 + c * 7 + h * 3 + w)
    images = rng.integers(0, 256, size=(n, c, h, w))
    images = images.astype(np.uint8) if uint8 else images.astype(np.float32) + 0.25
    labels = rng.integers(0, 10, size=n)
    layer.add_mat_vector(list(images), list(labels))
    want = (images.astype(np.float32) - np.float32(mean or 0)) * np.float32(scale)
    for it in range(k):
        assert layer.has_new_data
        layer.Forward([], top)
        assert top[0].shape == (b, c, h, w) and top[1].shape == (b,)
        np.testing.assert_array_equal(top[0].data, want[it * b:(it + 1) * b])
        np.testing.assert_array_equal(top[1].data, labels[it * b:(it + 1) * b])
        assert top[0].dtype == np.float32
    assert not layer.has_new_data  # consumed: adding works again
    layer.add_mat_vector(list(images[:b]), list(labels[:b]))


def test_add_mat_vector_errors_name_the_layer_and_the_image():
    layer, top = memory_layer(2, 1, 2, 2)
    ok = [np.zeros((1, 2, 2), np.uint8)] * 2
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): 2 images but 3 labels$"):
        layer.add_mat_vector(ok, [0, 1, 2])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): there is no image to add$"):
        layer.add_mat_vector([], [])
    with pytest.raises(LayerError, match=r"multiple of the batch size 2, got 3 images$"):
        layer.add_mat_vector(ok + ok[:1], [0, 1, 2])
    # the transformer's error, with the layer named once and the item by its index
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): image 1 is 1x3x2 but the batch holds "
                                         r"1x2x2 items"):
        layer.add_mat_vector([ok[0], np.zeros((1, 3, 2), np.uint8)], [0, 1])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): image 0 has shape \(2, 2\); expected"):
        layer.add_mat_vector([np.zeros((2, 2)), ok[0]], [0, 1])
    layer.add_mat_vector(ok, [0, 1])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): can't add images until current data "
                                         r"has been consumed$"):
        layer.add_mat_vector(ok, [0, 1])


def test_add_datum_vector_bad_datum_names_the_layer_and_the_datum():
    layer, top = memory_layer(2, 1, 2, 2)
    good = array_to_datum(np.zeros((1, 2, 2), np.uint8), 1)
    bad = array_to_datum(np.zeros((1, 2, 2), np.uint8), 1)
    bad.data = b"\0\0\0"
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): Datum 1: Datum holds 3 bytes of data"):
        layer.add_datum_vector([good, bad])


def test_add_datum_vector_errors_name_the_layer_and_the_datum():
    layer, top = memory_layer(2, 1, 2, 2)
    good = array_to_datum(np.zeros((1, 2, 2), np.uint8), 1)
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): there is no datum to add$"):
        layer.add_datum_vector([])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): datum 1 is 1x3x3 but the batch"):
        layer.add_datum_vector([good, array_to_datum(np.zeros((1, 3, 3), np.uint8), 0)])
    layer.add_datum_vector([good, good])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): can't add datums until current data "
                                         r"has been consumed$"):
        layer.add_datum_vector([good, good])


def test_set_batch_size_changes_the_batches_served():
    """Caffe's set_batch_size: the next Forward serves (and shapes the tops for) the new batch size."""
    layer, top = memory_layer(2, 1, 1, 2)
    data = np.arange(12, dtype=np.float32).reshape(6, 1, 1, 2)
    layer.reset(data, np.arange(6, dtype=np.float32), 6)
    layer.set_batch_size(3)
    assert layer.batch_size == 3
    for start in (0, 3, 0):
        layer.Forward([], top)
        assert top[0].shape == (3, 1, 1, 2) and top[1].shape == (3,)
        np.testing.assert_array_equal(top[1].data, np.arange(start, start + 3))
        np.testing.assert_array_equal(top[0].data, data[start:start + 3])
    layer.set_batch_size(1)  # 1 is a batch size
    layer.Forward([], top)
    np.testing.assert_array_equal(top[1].data, [3])
    layer.set_batch_size("2")  # pycaffe passes ints; a numeric string is read as Caffe's int would be
    assert layer.batch_size == 2
    with pytest.raises(LayerError, match="multiple of the batch size 2, got 3 images"):
        layer.add_mat_vector([np.zeros((1, 1, 2))] * 3, [0] * 3)


def test_set_batch_size_errors():
    layer, top = memory_layer(2, 1, 1, 1)
    for bad in (0, -1):
        with pytest.raises(LayerError, match=rf"^Layer 'mem' \(MemoryData\): batch_size must be positive, "
                                             rf"got {bad}$"):
            layer.set_batch_size(bad)
    assert layer.batch_size == 2
    layer.add_mat_vector([np.ones((1, 1, 1))] * 2, [0, 1])
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): can't change batch_size until current "
                                         r"data has been consumed$"):
        layer.set_batch_size(1)
    layer.Forward([], top)
    layer.set_batch_size(1)  # consumed
    assert layer.batch_size == 1


# -- HDF5Output -----------------------------------------------------------------------------------

def test_hdf5_output_stores_legacy_4d_rows_and_appends(tmp_path):
    """Caffe writes num x channels x height x width whatever the bottoms' axes: a (N, D) data bottom is stored
    (N, D, 1, 1), a (N,) label (N, 1, 1, 1); later batches append."""
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "o.h5"
    layer = make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{out}" }}')
    bottom = [Blob(2, 5), Blob(2)]
    layer.SetUp(bottom, [])
    for k in range(2):
        bottom[0].data[...] = np.arange(10).reshape(2, 5) + 10 * k
        bottom[1].data[...] = [k, -k]
        layer.Forward(bottom, [])
    with h5py.File(out, "r") as f:
        assert f["data"].shape == (4, 5, 1, 1) and f["label"].shape == (4, 1, 1, 1)
        np.testing.assert_array_equal(f["data"][...].reshape(4, 5), np.arange(20).reshape(4, 5))
        np.testing.assert_array_equal(f["label"][...].ravel(), [0, 0, 1, -1])


def test_hdf5_output_error_texts(tmp_path):
    pytest.importorskip("h5py")
    with pytest.raises(LayerError, match=r"^Layer 'test' \(HDF5Output\): hdf5_output_param.file_name must name "
                                         r"the HDF5 file to write$"):
        make_layer("HDF5Output").SetUp([Blob(1), Blob(1)], [])
    (tmp_path / "dir.h5").mkdir()  # the folder exists, but the file cannot be created: a folder has its name
    with pytest.raises(LayerError, match=r"^Layer 'test' \(HDF5Output\): cannot create HDF5 file '.*dir.h5': "):
        make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{tmp_path}/dir.h5" }}').SetUp(
            [Blob(1), Blob(1)], [])
    layer = make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{tmp_path}/o.h5" }}')
    bottom = [Blob(2, 3), Blob(3)]
    layer.SetUp(bottom, [])
    with pytest.raises(LayerError, match=r"same num: bottom\[0\] \(2, 3\) vs bottom\[1\] \(3,\)$"):
        layer.Forward(bottom, [])
    bottom = [Blob(2, 3), Blob(2)]
    layer.Forward(bottom, [])
    with pytest.raises(LayerError, match=r"^Layer 'test' \(HDF5Output\): bottom 'data' changed shape from "
                                         r"\(3, 1, 1\) to \(4, 1, 1\) between batches; HDF5 file '.*o.h5' needs "
                                         r"one row shape$"):
        layer.Forward([Blob(2, 4), Blob(2)], [])


# -- Caffe's method names -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_cursor_caffe_names_call_the_backends_cursor(tmp_path, backend):
    """Cursor.SeekToFirst/Next/Valid were class aliases of the base class's NotImplementedError stubs."""
    if backend == "leveldb":
        pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    from caffe.layers import db
    path = str(tmp_path / "db")
    db.write_db(path, [(b"a", b"1"), (b"b", b"2")], backend)
    with db.open_db(path, backend) as d:
        cur = d.NewCursor()
        assert cur.Valid() and cur.key() == b"a"
        cur.Next()
        assert cur.Valid() and cur.value() == b"2"
        cur.Next()
        assert not cur.Valid()
        cur.SeekToFirst()
        assert cur.Valid() and cur.key() == b"a"


def test_data_layer_setup_caffe_name_calls_the_layers_own():
    """BaseDataLayer.DataLayerSetUp was an alias of the base class's no-op: MemoryData's tops stayed unshaped."""
    layer, _ = memory_layer(3, 2, 1, 1)
    top = [Blob(), Blob()]
    layer.DataLayerSetUp([], top)
    assert top[0].shape == (3, 2, 1, 1) and top[1].shape == (3,)


# -- HDF5Data -------------------------------------------------------------------------------------

def h5_list(tmp_path, *files, name="list.txt"):
    """Write each {dataset: array} dict to an .h5 file and list them; returns the list file's path."""
    h5py = pytest.importorskip("h5py")
    paths = []
    for i, datasets in enumerate(files):
        p = tmp_path / f"f{i}.h5"
        with h5py.File(p, "w") as f:
            for k, v in datasets.items():
                f[k] = v
        paths.append(str(p))
    lst = tmp_path / name
    lst.write_text("\n".join(paths) + "\n")
    return lst


def h5_layer(source, batch, tops=("data",), shuffle=False, phase=0, name="h5"):
    layer = make_layer("HDF5Data", f'hdf5_data_param {{ source: "{source}" batch_size: {batch} '
                                   f'shuffle: {str(shuffle).lower()} }}', phase=phase, name=name)
    layer.layer_param.top.extend(tops)
    return layer


def served(layer, n_forward, n_top=1):
    top = [Blob() for _ in range(n_top)]
    layer.SetUp([], top)
    out = []
    for _ in range(n_forward):
        layer.Forward([], top)
        out += list(top[0].data.reshape(top[0].shape[0], -1)[:, 0])
    return out


def test_hdf5_data_batch_size_one_and_a_one_row_file(tmp_path):
    lst = h5_list(tmp_path, {"data": np.array([[7.0]])}, {"data": np.array([[8.0], [9.0]])})
    assert served(h5_layer(lst, 1), 4) == [7, 8, 9, 7]
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): hdf5_data_param.batch_size must be "
                                         r"positive, got 0$"):
        h5_layer(lst, 0).SetUp([], [Blob()])


@pytest.mark.parametrize("count, rank, want", [(3, 1, [1, 4, 7, 1]), (3, 2, [2, 5, 8, 2]), (2, 1, [1, 3, 5, 7])])
def test_hdf5_data_shards_for_any_solver_count_but_not_in_test(tmp_path, count, rank, want):
    """Caffe's Skip(): rank r keeps stream positions r, r+N, ... (across wraps); the TEST phase keeps all."""
    lst = h5_list(tmp_path, {"data": np.arange(9.0)[:, None]})
    try:
        context.set_solver_count(count)
        context.set_solver_rank(rank)
        assert served(h5_layer(lst, 2), 2) == want
        assert served(h5_layer(lst, 3, phase=1), 1) == [0, 1, 2]
    finally:
        context.set_solver_count(1)
        context.set_solver_rank(0)


def test_hdf5_data_shuffle_permutes_and_is_reproducible(tmp_path):
    lst = h5_list(tmp_path, {"data": np.arange(8.0)[:, None]}, {"data": np.arange(8.0, 16.0)[:, None]})
    assert served(h5_layer(lst, 4), 8) == list(range(16)) * 2  # in order without shuffle
    runs = []
    for _ in range(2):
        context.set_random_seed(11)
        runs.append(served(h5_layer(lst, 4, shuffle=True), 8))
    assert runs[0] == runs[1]
    first_pass, second_pass = runs[0][:16], runs[0][16:]
    assert sorted(first_pass) == sorted(second_pass) == list(range(16))
    assert first_pass != list(range(16)) and second_pass != first_pass  # rows (and files) reshuffled each pass


def test_hdf5_data_one_file_is_loaded_once(tmp_path, monkeypatch):
    """As Caffe: with a single file, wrapping around serves it again without reloading it."""
    lst = h5_list(tmp_path, {"data": np.arange(3.0)[:, None]})
    layer = h5_layer(lst, 2)
    loads = []
    real = layer.load_file
    monkeypatch.setattr(layer, "load_file", lambda f: (loads.append(f), real(f)))
    assert served(layer, 4) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert len(loads) == 1  # at setup only


def test_hdf5_data_row_shapes_must_agree_across_files(tmp_path):
    lst = h5_list(tmp_path, {"data": np.zeros((2, 3, 2)), "label": np.zeros(2)},
                  {"data": np.zeros((2, 3, 1)), "label": np.zeros(2)})
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): HDF5 file '.*f1.h5' has row shapes "
                                         r"\[\(3, 1\), \(\)\] but the first file had \[\(3, 2\), \(\)\]$"):
        served(h5_layer(lst, 2, tops=("data", "label")), 2, n_top=2)
    # the same row shapes in files of different lengths are fine
    ok = h5_list(tmp_path, {"data": np.zeros((1, 3, 2))}, {"data": np.ones((3, 3, 2))}, name="ok.txt")
    assert served(h5_layer(ok, 2), 2) == [0, 1, 1, 1]


def test_hdf5_data_tops_without_names_read_top0_top1(tmp_path):
    lst = h5_list(tmp_path, {"top0": np.arange(4.0)[:, None], "top1": np.arange(4.0) + 10})
    layer = h5_layer(lst, 2, tops=())
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    assert list(top[0].data.ravel()) == [0, 1] and list(top[1].data) == [10, 11]


def test_hdf5_data_error_texts(tmp_path):
    h5py = pytest.importorskip("h5py")
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): hdf5_data_param.source must name a text "
                                         r"file listing HDF5 files$"):
        h5_layer("", 1).SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): Cannot open HDF5 list file "
                                         r"\(hdf5_data_param.source\) '.*nolist.txt': no such file"):
        h5_layer(tmp_path / "nolist.txt", 1).SetUp([], [Blob()])
    layer = h5_layer(h5_list(tmp_path, {"data": np.zeros((2, 1))}), 1, tops=("data", "label"))
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): the layer names 2 tops but was given 1 "
                                         r"blobs$"):
        layer.SetUp([], [Blob()])
    (tmp_path / "adir.h5").mkdir()
    (tmp_path / "dir.txt").write_text(str(tmp_path / "adir.h5"))
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): Cannot read HDF5 file '.*adir.h5': it is a "
                                         r"directory, not a regular file .*\(listed in '.*dir.txt'\)$"):
        h5_layer(tmp_path / "dir.txt", 1).SetUp([], [Blob()])
    (tmp_path / "text.h5").write_text("not hdf5")
    (tmp_path / "text.txt").write_text(str(tmp_path / "text.h5"))
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): cannot open HDF5 file '.*text.h5': \S"):
        h5_layer(tmp_path / "text.txt", 1).SetUp([], [Blob()])

    def one(name, **datasets):
        lst = tmp_path / f"{name}.txt"
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            for k, v in datasets.items():
                f[k] = v
        lst.write_text(str(tmp_path / f"{name}.h5"))
        return h5_layer(lst, 1)

    with pytest.raises(LayerError, match=r"has no dataset 'data' for top 'data' \(datasets: none\)$"):
        one("nods").SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): HDF5 file '.*scalar.h5' dataset 'data' is "
                                         r"a scalar; it needs at least one axis \(rows\)$"):
        one("scalar", data=np.float32(1)).SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"dataset 'data' holds values of type complex128, not numbers$"):
        one("cplx", data=np.zeros(2, np.complex128)).SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"dataset 'data' holds strings, not numbers$"):
        one("str", data=np.array([b"a", b"b"])).SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'h5' \(HDF5Data\): HDF5 file '.*empty.h5' holds no rows$"):
        one("empty", data=np.zeros((0, 2))).SetUp([], [Blob()])


# -- MemoryData: reset and setup ------------------------------------------------------------------

@pytest.mark.parametrize("labels", [np.arange(4.0), np.arange(4.0)[:, None], np.arange(4.0).reshape(4, 1, 1, 1)],
                         ids=["1d", "2d", "4d"])
def test_memory_data_labels_of_any_legacy_shape_give_a_1d_label_top(labels):
    layer, top = memory_layer(2, 1, 1, 1)
    layer.reset(np.zeros((4, 1, 1, 1), np.float32), labels)
    for start in (0, 2):
        layer.Forward([], top)
        assert top[1].shape == (2,)
        np.testing.assert_array_equal(top[1].data, [start, start + 1])


def test_memory_data_scalar_label_for_a_batch_of_one():
    layer, top = memory_layer(1, 1, 1, 1)
    layer.reset(np.ones((1, 1, 1, 1), np.float32), np.float32(5))
    layer.Forward([], top)
    assert top[1].shape == (1,) and top[1].data[0] == 5


def test_memory_data_other_dtypes_are_copied_at_reset():
    """Only an array already in the top's dtype is borrowed; anything else is converted once, at reset."""
    layer, top = memory_layer(2, 1, 1, 1)
    data, labels = np.ones((2, 1, 1, 1), np.float64), np.array([1, 2])
    layer.reset(data, labels)
    data[...] = 9
    labels[...] = 9
    layer.Forward([], top)
    assert list(top[0].data.ravel()) == [1, 1] and list(top[1].data) == [1, 2]


def test_memory_data_reset_and_forward_error_texts():
    layer, top = memory_layer(2, 1, 2, 3)
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): MemoryDataLayer needs to be initialized by "
                                         r"calling reset\(\) \(pycaffe: net.set_input_arrays\)$"):
        layer.Forward([], top)
    with pytest.raises(LayerError, match=r"data array must have shape \(n, 1, 2, 3\), got \(\)$"):
        layer.reset(np.float32(1), np.zeros(2))
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): data array holds 2 items, fewer than "
                                         r"n = 4$"):
        layer.reset(np.zeros((2, 1, 2, 3)), np.zeros(4), 4)
    with pytest.raises(LayerError, match=r"^Layer 'mem' \(MemoryData\): labels array holds 2 labels, fewer than "
                                         r"n = 4; data and labels must have the same first dimension$"):
        layer.reset(np.zeros((4, 1, 2, 3)), np.zeros((2, 2)), 4)  # 4 values, but 2 rows
    with pytest.raises(LayerError, match=r"labels array holds 1 labels, fewer than n = 2"):
        layer.reset(np.zeros((2, 1, 2, 3)), np.float32(0))
    with pytest.raises(LayerError, match=r"n must be a positive multiple of batch size 2, got n = 0$"):
        layer.reset(np.zeros((2, 1, 2, 3)), np.zeros(2), 0)


@pytest.mark.parametrize("field", ["batch_size", "channels", "height", "width"])
def test_memory_data_every_size_must_be_positive(field):
    sizes = {**dict(batch_size=2, channels=1, height=2, width=3), field: 0}
    text = " ".join(f"{k}: {v}" for k, v in sizes.items())
    with pytest.raises(LayerError, match=r"^Layer 'test' \(MemoryData\): batch_size, channels, height, and width "
                                         r"must be specified and positive in memory_data_param \(got "
                                         rf"{sizes['batch_size']}, {sizes['channels']}, {sizes['height']}, "
                                         rf"{sizes['width']}\)$"):
        make_layer("MemoryData", f"memory_data_param {{ {text} }}").SetUp([], [Blob(), Blob()])


def test_dummy_data_shape_and_legacy_together_text():
    with pytest.raises(LayerError, match=r"^Layer 'test' \(DummyData\): both shape and legacy fields \(num, "
                                         r"channels, height, width\) were specified$"):
        make_layer("DummyData", "dummy_data_param { shape { dim: 1 } width: 1 }").SetUp([], [Blob()])


# -- db (layers-14) -------------------------------------------------------------------------------

def test_describe_folder_hints(tmp_path):
    from caffe.layers import db
    (tmp_path / "ldb").mkdir()
    (tmp_path / "ldb" / "000005.ldb").write_bytes(b"")  # LevelDB table files, CURRENT missing
    with pytest.raises(db.DBError, match=r"looks like a LevelDB database: set backend: LEVELDB / -backend "
                                         r"leveldb\)$"):
        db.open_db(str(tmp_path / "ldb"), "lmdb")
    (tmp_path / "plain").mkdir()
    with pytest.raises(db.DBError, match=r"^'.*plain' is not an LMDB database: it has no data.mdb$"):
        db.open_db(str(tmp_path / "plain"), "lmdb")


def test_partial_folders_of_live_writers_are_kept_and_not_signalled(tmp_path, monkeypatch):
    """The next writer removes only dead writers' folders: probing a live one (signal 0) must not hurt it,
    and a process of another user (PermissionError) counts as alive."""
    import subprocess
    import sys
    from caffe.layers import db
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".t_db.partial-{child.pid}-0123abcd").mkdir()
        db.write_db(str(tmp_path / "t_db"), [(b"k", b"v")])
        assert (tmp_path / f".t_db.partial-{child.pid}-0123abcd").is_dir()
        assert child.poll() is None  # still running: probed with signal 0 only
    finally:
        child.kill()
        child.wait()

    def refused(pid, sig):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(db.os, "kill", refused)
    assert db._pid_alive(12345) is True


def test_db_writer_abort_closes_and_is_idempotent(tmp_path):
    from caffe.layers import db
    w = db.DBWriter(str(tmp_path / "a_db"))
    w.put(b"k", b"v")
    w.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(db.DBError, match=r"database '.*a_db' is already closed"):
        w.put(b"k2", b"v")
    w.abort()  # again: nothing left to remove, no error
    done = db.DBWriter(str(tmp_path / "b_db"))
    done.put(b"k", b"v")
    done.close()
    done.abort()  # after close: the database stays
    with db.open_db(str(tmp_path / "b_db")) as d:
        assert list(d.items()) == [(b"k", b"v")]


# -- window data's rounding -----------------------------------------------------------------------

def test_window_round_is_c_round_half_away_from_zero():
    from caffe.layers.window_data_layer import _round
    xs = [-2.5, -1.5, -0.6, -0.5, -0.4, 0.0, 0.4, 0.5, 0.6, 1.5, 2.5, 3.7]
    assert [_round(x) for x in xs] == [-3, -2, -1, -1, 0, 0, 0, 1, 1, 2, 3, 4]


# -- DataTransformer.transform (layers-14) --------------------------------------------------------

def test_transform_returns_the_dtype_asked_and_names_the_item():
    from caffe.layers.data_transformer import DataError, DataTransformer
    from caffe.proto import caffe_pb2
    p = caffe_pb2.TransformationParameter()
    p.scale = 0.1
    tf = DataTransformer(p, name="T")
    img = np.arange(4, dtype=np.uint8).reshape(1, 2, 2)
    out = tf.transform(img)
    assert out.dtype == np.float32 and out.shape == (1, 2, 2)
    np.testing.assert_array_equal(out, img.astype(np.float32) * np.float32(0.1))
    assert tf.transform(img, dtype=np.float64).dtype == np.float64
    with pytest.raises(DataError, match=r"^T: image 'x' is 1x2x2 but the batch holds 1x3x3 items"):
        tf.transform(img, out=np.empty((1, 3, 3), np.float32), where="image 'x'")
    with pytest.raises(DataError, match=r"^T: image 'y' has shape \(2, 2\); expected channels x height x width$"):
        tf.transform(np.zeros((2, 2)), where="image 'y'")
    bad = array_to_datum(img, 0)
    bad.data = b"\0"
    with pytest.raises(DataError, match=r"^Datum 7: Datum holds 1 bytes"):
        tf.transform(bad, where="Datum 7")
    with pytest.raises(DataError, match=r"^Datum: Datum holds 1 bytes"):
        tf.transform(bad)


# -- base_data (layers-14) ------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_decode_pool_works_in_a_forked_child():
    """A child forked after a parallel decode inherited the pool without its threads: its next parallel
    decode (Data with encoded records, ImageData) waited forever. The child now starts its own pool."""
    from caffe.layers import base_data
    from caffe.layers.data_transformer import decode_threads
    if decode_threads() == 1:
        pytest.skip("one core: parallel_map does not use the pool")
    assert base_data.parallel_map(lambda x: x + 1, [1, 2, 3]) == [2, 3, 4]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the pool answers (SIGALRM ends a hang after 20 s)
        import signal
        signal.alarm(20)
        ok = False
        try:
            ok = base_data.parallel_map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"forked child: wait status {status}"


# -- WindowData's warp (layers-14) ----------------------------------------------------------------

def c_round(v: float) -> int:
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def caffe_window_geometry(win, cols, rows, crop, context_pad, square, mirror):
    """Caffe's window_data_layer.cpp, float32 as in a float net: the region read (x1, y1, x2, y2), the size it
    is warped to (w, h) and where it lands (pad_h, pad_w)."""
    f = np.float32
    x1, y1, x2, y2 = win
    w = h = crop
    pad_h = pad_w = 0
    if context_pad > 0 or square:
        scale = f(crop) / f(crop - 2 * context_pad)
        half_h, half_w = f((y2 - y1 + 1) / 2.0), f((x2 - x1 + 1) / 2.0)
        cx, cy = f(x1) + half_w, f(y1) + half_h
        if square:
            half_h = half_w = max(half_h, half_w)
        x1, x2 = c_round(float(cx - half_w * scale)), c_round(float(cx + half_w * scale))
        y1, y2 = c_round(float(cy - half_h * scale)), c_round(float(cy + half_h * scale))
        full_h, full_w = y2 - y1 + 1, x2 - x1 + 1
        left, top, right = max(0, -x1), max(0, -y1), max(0, x2 - (cols - 1))
        bottom = max(0, y2 - (rows - 1))
        x1, y1, x2, y2 = x1 + left, y1 + top, x2 - right, y2 - bottom
        sx, sy = f(crop) / f(full_w), f(crop) / f(full_h)
        w, h = c_round(float(f(x2 - x1 + 1) * sx)), c_round(float(f(y2 - y1 + 1) * sy))
        pad_h = c_round(float(f(top) * sy))
        pad_w = c_round(float(f(right if mirror else left) * sx))
        h, w = min(h, crop - pad_h), min(w, crop - pad_w)
    return (x1, y1, x2, y2), (w, h), pad_h, pad_w


class _SpyImage:
    """Stands for the Pillow image: records the region cropped and the size it is resized to."""

    def __init__(self, cols, rows):
        self.size = (cols, rows)
        self.calls = []

    def crop(self, box):
        self.calls.append(("crop", box))
        return self

    def resize(self, size, method):
        from PIL import Image
        self.calls.append(("resize", size))
        return Image.new("RGB", size)


def window_warper(crop, context_pad, square):
    pytest.importorskip("PIL")
    layer = make_layer("WindowData")
    layer.crop_size, layer.context_pad, layer.use_square = crop, context_pad, square
    layer.images = {0: ("img.png", (3, 0, 0))}
    return layer


@given(cols=st.integers(1, 12), rows=st.integers(1, 12), data=st.data(), crop=st.integers(1, 9),
       square=st.booleans(), mirror=st.booleans())
@example(cols=12, rows=10, data=None, crop=7, square=False, mirror=False)   # context_pad 1, warp mode
@example(cols=12, rows=10, data=None, crop=8, square=True, mirror=True)     # a window at the right edge
@example(cols=5, rows=12, data=None, crop=3, square=True, mirror=False)     # tall window, square
def test_window_warp_geometry_matches_caffe(cols, rows, data, crop, square, mirror):
    if data is None:  # the examples: fixed windows
        win, context_pad = {(12, 7): ((2, 3, 6, 5), 1), (12, 8): ((9, 2, 11, 9), 2),
                            (5, 3): ((2, 0, 2, 11), 1)}[(cols, crop)]
    else:
        x1 = data.draw(st.integers(0, cols - 1))
        x2 = data.draw(st.integers(x1, cols - 1))
        y1 = data.draw(st.integers(0, rows - 1))
        y2 = data.draw(st.integers(y1, rows - 1))
        win, context_pad = (x1, y1, x2, y2), data.draw(st.integers(0, (crop - 1) // 2))
    layer = window_warper(crop, context_pad, square)
    img = _SpyImage(cols, rows)
    arr, pad_h, pad_w = layer._warp(img, [0, 1, 1.0, *win], mirror)
    box, size, want_h, want_w = caffe_window_geometry(win, cols, rows, crop, context_pad, square, mirror)
    assert (pad_h, pad_w) == (want_h, want_w)
    if size[0] <= 0 or size[1] <= 0:
        assert arr is None and img.calls == []
    else:
        x1, y1, x2, y2 = box
        assert img.calls == [("crop", (x1, y1, x2 + 1, y2 + 1)), ("resize", size)]
        assert arr.shape == (3, size[1], size[0])


def test_window_outside_its_image_is_named():
    layer = window_warper(4, 0, False)
    for win in [(0, 0, 9, 7), (3, 3, 3, 3), (9, 0, 9, 0), (0, 7, 0, 7)]:  # inside (edges included): read
        img = _SpyImage(10, 8)
        layer._warp(img, [0, 1, 1.0, *win], False)
        assert img.calls[0] == ("crop", (win[0], win[1], win[2] + 1, win[3] + 1))
    for win in [(0, 0, 10, 7), (0, 0, 9, 8), (-1, 0, 3, 3), (0, -1, 3, 3), (5, 0, 4, 3), (0, 5, 3, 4)]:
        from caffe.layers.data_transformer import DataError
        with pytest.raises(DataError, match=rf"^window \({win[0]}, {win[1]}, {win[2]}, {win[3]}\) lies outside "
                                            rf"its 10x8 image 'img.png'$"):
            layer._warp(_SpyImage(10, 8), [0, 1, 1.0, *win], False)


# -- ImageData (layers-14) ------------------------------------------------------------------------

def test_image_data_errors_in_later_batches_name_the_image_and_line(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    for name, (h, w) in {"big.png": (6, 8), "small.png": (4, 4), "wide.png": (6, 9)}.items():
        Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(tmp_path / name)
    (tmp_path / "l1.txt").write_text("big.png 0\nsmall.png 1\n")
    layer = make_layer("ImageData", f'image_data_param {{ source: "{tmp_path}/l1.txt" root_folder: "{tmp_path}/" '
                                    f'batch_size: 1 }} transform_param {{ crop_size: 5 }}', name="img")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): image '.*small.png' \(list file '.*l1.txt' "
                                         r"line 2\) is 4x4, smaller than crop_size 5$"):
        layer.Forward([], top)
    layer.close()
    (tmp_path / "l2.txt").write_text("big.png 0\nwide.png 1\n")
    layer = make_layer("ImageData", f'image_data_param {{ source: "{tmp_path}/l2.txt" root_folder: "{tmp_path}/" '
                                    f'batch_size: 2 }}', name="img")
    layer.SetUp([], top)
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): image '.*wide.png' \(list file '.*l2.txt' "
                                         r"line 2\) is 3x6x9 but the batch holds 3x6x8 items"):
        layer.Forward([], top)
    layer.close()


def test_window_file_parse_errors(tmp_path):
    from caffe.layers.data_transformer import DataError
    from caffe.layers.window_data_layer import parse_window_file
    f = tmp_path / "w.txt"
    for text, tail in [("# 0\nim.png\n3\n16\n20\n1\n1 0.9 1 1 4", "ended early, expected window coordinates x1 y1 "
                                                                  "x2 y2"),
                       ("# 0\nim.png\n3\n16", "ended early, expected width"),
                       ("# 0\nim.png\n3\n16\n20\n1\n1 high 1 1 4 4", "line 7: expected a window's overlap, "
                                                                   "got 'high'"),
                       ("0\nim.png", "line 1: expected '# image_index', got '0'")]:
        f.write_text(text)
        with pytest.raises(DataError, match=rf"^window file '.*w.txt':? {tail}$"):
            parse_window_file(str(f))
    with pytest.raises(DataError, match=r"^failed to open window file '.*none.txt': no such file$"):
        parse_window_file(str(tmp_path / "none.txt"))
    f.write_text("# 3\nim.png\n3 16 20\n1\n1 0.75 0 1 4 5\n")
    images, windows = parse_window_file(str(f), "root/")
    assert images == {3: ("root/im.png", (3, 16, 20))}
    assert windows == [([3, 1, np.float32(0.75), 0, 1, 4, 5], 5)]


def _window_setup(tmp_path, windows, extra="", crop=6, batch=2, fg=1.0, transform="", name="win"):
    """One 12x10 image (BGR on disk as PNG RGB) and the given (label, overlap, x1, y1, x2, y2) windows."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, size=(10, 12, 3)).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "im.png")
    lines = ["# 0", "im.png", "3", "10", "12", str(len(windows))] + [" ".join(map(str, w)) for w in windows]
    (tmp_path / "w.txt").write_text("\n".join(lines) + "\n")
    layer = make_layer("WindowData", f'window_data_param {{ source: "{tmp_path}/w.txt" root_folder: "{tmp_path}/" '
                                     f'batch_size: {batch} fg_fraction: {fg} fg_threshold: 0.5 bg_threshold: 0.3 '
                                     f'{extra} }} transform_param {{ crop_size: {crop} {transform} }}', name=name)
    return layer, Image.fromarray(rgb)


@pytest.mark.parametrize("mode, context_pad, crop", [("square", 0, 6), ("square", 1, 5), ("warp", 1, 5),
                                                     ("warp", 0, 1)])
def test_window_data_items_match_caffes_geometry(tmp_path, mode, context_pad, crop):
    """End to end: a 10 wide x 4 high window at the image's top edge, square and/or with context; the item is
    the region Caffe reads, warped (bilinear) to its size, placed at Caffe's padding, zeros elsewhere."""
    from PIL import Image
    win = (3, 0.9, 1, 0, 10, 3)  # label 3, foreground
    layer, img = _window_setup(tmp_path, [win], f'crop_mode: "{mode}" context_pad: {context_pad}', crop=crop,
                               batch=1)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    layer.close()
    (x1, y1, x2, y2), (w, h), pad_h, pad_w = caffe_window_geometry(win[2:], 12, 10, crop, context_pad,
                                                                   mode == "square", False)
    want = np.zeros((3, crop, crop), np.float32)
    region = np.asarray(img.crop((x1, y1, x2 + 1, y2 + 1)).resize((w, h), Image.BILINEAR))
    want[:, pad_h:pad_h + h, pad_w:pad_w + w] = region[:, :, ::-1].transpose(2, 0, 1)
    np.testing.assert_array_equal(top[0].data[0], want)
    assert top[1].data[0] == 3


def test_window_data_setup_boundaries(tmp_path):
    wins = [(1, 0.5, 0, 0, 5, 5), (0, 0.1, 2, 2, 6, 6)]  # overlap == fg_threshold: foreground, as Caffe's >=
    layer, _ = _window_setup(tmp_path, wins, batch=1, fg=1.0, crop=1)  # batch 1, crop 1: allowed
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (1, 3, 1, 1)
    layer.Forward([], top)
    assert top[1].data[0] == 1
    layer.close()
    layer, _ = _window_setup(tmp_path, wins, "context_pad: 2", crop=5)  # 2 * 2 < 5: allowed
    layer.SetUp([], top)
    layer.close()
    for extra, crop, batch, text in [
            ("context_pad: 3", 6, 2, r"context_pad 3 leaves no room in crop_size 6$"),
            ("", 6, 0, r"window_data_param.batch_size must be positive, got 0$"),
            ("", 0, 2, r"transform_param.crop_size must be positive: it is the size of the warped windows$")]:
        layer, _ = _window_setup(tmp_path, wins, extra, crop=crop, batch=batch)
        with pytest.raises(LayerError, match=r"^Layer 'win' \(WindowData\): " + text):
            layer.SetUp([], [Blob(), Blob()])


def test_window_data_transform_scale_when_window_scale_is_unset(tmp_path):
    """The docstring's rule: window_data_param.scale when set, else transform_param.scale."""
    wins = [(2, 0.9, 0, 0, 5, 5)]
    out = {}
    for key, extra, transform in [("plain", "", ""), ("tp", "", "scale: 0.5"), ("wp", "scale: 0.25", "scale: 0.5")]:
        layer, _ = _window_setup(tmp_path, wins, extra, batch=1, transform=transform)
        top = [Blob(), Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        layer.close()
        out[key] = top[0].data.copy()
    np.testing.assert_array_equal(out["tp"], out["plain"] * np.float32(0.5))
    np.testing.assert_array_equal(out["wp"], out["plain"] * np.float32(0.25))


def test_window_data_setup_error_texts_and_the_window_mean_file(tmp_path):
    from caffe.blob.proto_io import array_to_blob_proto
    fg_only = [(1, 0.9, 0, 0, 5, 5)]
    layer, _ = _window_setup(tmp_path, fg_only, fg=0.5, batch=2)
    with pytest.raises(LayerError, match=r"^Layer 'win' \(WindowData\): window file '.*w.txt' has no background "
                                         r"windows \(overlap < bg_threshold 0\.3\S*\) but fg_fraction leaves 1 per "
                                         r"batch$"):
        layer.SetUp([], [Blob(), Blob()])
    mean = np.full((1, 3, 6, 6), 7, np.float32)
    (tmp_path / "m.binaryproto").write_bytes(array_to_blob_proto(mean).SerializeToString())
    layer, _ = _window_setup(tmp_path, fg_only, f'mean_file: "{tmp_path}/m.binaryproto"', batch=1,
                             transform="mean_value: 1")  # the window's mean_file with transform's mean_value
    with pytest.raises(LayerError, match=r"^Layer 'win' \(WindowData\): cannot specify mean_file and mean_value "
                                         r"at the same time$"):
        layer.SetUp([], [Blob(), Blob()])
    # window_data_param's own (deprecated) mean_file is read when transform_param has none
    out = []
    for extra in ("", f'mean_file: "{tmp_path}/m.binaryproto"'):
        layer, _ = _window_setup(tmp_path, fg_only, extra, batch=1)
        top = [Blob(), Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        layer.close()
        out.append(top[0].data.copy())
    np.testing.assert_array_equal(out[1], out[0] - 7)


def test_window_data_mean_file_shape_checks_and_image_cache(tmp_path):
    from caffe.blob.proto_io import array_to_blob_proto
    fg_only = [(1, 0.9, 0, 0, 5, 5)]
    for shape in [(1, 6, 6), (3, 5, 8), (3, 8, 5)]:
        (tmp_path / "m.binaryproto").write_bytes(array_to_blob_proto(np.zeros((1,) + shape, np.float32))
                                                 .SerializeToString())
        layer, _ = _window_setup(tmp_path, fg_only, batch=1, transform=f'mean_file: "{tmp_path}/m.binaryproto"')
        with pytest.raises(LayerError, match=rf"^Layer 'win' \(WindowData\): mean_file '.*m.binaryproto' holds a "
                                             rf"{shape[0]}x{shape[1]}x{shape[2]} mean; it needs 3 channels and at "
                                             rf"least crop_size 6 in height and width$"):
            layer.SetUp([], [Blob(), Blob()])
    layer, _ = _window_setup(tmp_path, fg_only, "cache_images: true", batch=1)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    (tmp_path / "im.png").unlink()  # cached at setup: still served
    for _ in range(6):  # more batches than the 4 prefetched: some are loaded after the file is gone
        layer.Forward([], top)
    layer.close()
    assert top[0].data.any()


def test_transformer_draws_from_its_own_generator_seeded_once():
    """Caffe's InitRand: the transformer seeds its own generator once (on first use when init_rand was not
    called); later draws leave the runtime generator alone."""
    from caffe.layers.data_transformer import DataTransformer
    from caffe.proto import caffe_pb2
    p = caffe_pb2.TransformationParameter()
    p.mirror = True
    tf = DataTransformer(p)  # no init_rand(): rng() seeds it
    imgs = np.arange(2 * 8, dtype=np.uint8).reshape(8, 1, 1, 2)
    out = np.empty((8, 1, 1, 2), np.float32)
    context.set_random_seed(5)
    tf.transform_batch(list(imgs), out)
    state = context.rng().bit_generator.state
    tf.transform_batch(list(imgs), out)
    assert context.rng().bit_generator.state == state


def test_read_image_sizes_and_color(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    from caffe.layers.data_transformer import read_image
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4), "L").save(tmp_path / "g.png")
    assert read_image(str(tmp_path / "g.png")).shape == (3, 3, 4)  # color by default: gray made BGR
    assert read_image(str(tmp_path / "g.png"), is_color=False).shape == (1, 3, 4)
    assert read_image(str(tmp_path / "g.png"), 1, 1).shape == (3, 1, 1)  # 1 is a size
    assert read_image(str(tmp_path / "g.png"), 5, 1, is_color=False).shape == (1, 5, 1)
    assert read_image(str(tmp_path / "g.png"), 5, 0).shape == (3, 3, 4)  # both needed to resize
    assert read_image(str(tmp_path / "g.png"), 0, 5).shape == (3, 3, 4)


def _image_list(tmp_path, n=5):
    Image = pytest.importorskip("PIL.Image")
    lines = []
    for i in range(n):
        Image.fromarray(np.full((4, 6, 3), i, np.uint8)).save(tmp_path / f"p{i}.png")
        lines.append(f"p{i}.png {i * 10}")
    (tmp_path / "l.txt").write_text("\n".join(lines) + "\n")


def _image_layer(tmp_path, extra="", batch=2, transform=""):
    return make_layer("ImageData", f'image_data_param {{ source: "{tmp_path}/l.txt" root_folder: "{tmp_path}/" '
                                   f'batch_size: {batch} {extra} }} transform_param {{ {transform} }}', name="img")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_image_data_rand_skip_starts_at_a_drawn_line(tmp_path, seed):
    """Caffe: skip = caffe_rng_rand() % rand_skip lines at setup (drawn from the runtime generator)."""
    _image_list(tmp_path)
    context.set_random_seed(seed)
    skip = int(context.rng().integers(0, 2**32)) % 4
    context.set_random_seed(seed)
    layer = _image_layer(tmp_path, "rand_skip: 4", batch=3)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    layer.close()
    assert top[1].shape == (3,)
    assert list(top[1].data) == [(skip + i) % 5 * 10 for i in range(3)]
    assert top[0].data[0, 0, 0, 0] == skip


def test_image_data_setup_boundaries(tmp_path):
    _image_list(tmp_path, 2)
    layer = _image_layer(tmp_path, "new_height: 1 new_width: 1", batch=1)  # 1 is a size; batch 1
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (1, 3, 1, 1) and top[1].shape == (1,)
    layer.close()
    for extra, text in [("new_height: 0 new_width: 3", "image_data_param.new_height and new_width must be set at "
                                                       "the same time$"),
                        ("batch_size: 0", r"image_data_param.batch_size must be positive, got 0$")]:
        with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): " + text):
            make_layer("ImageData", f'image_data_param {{ source: "{tmp_path}/l.txt" batch_size: 1 {extra} }}'
                       .replace("batch_size: 1 batch_size: 0", "batch_size: 0"), name="img").SetUp(
                [], [Blob(), Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): image_data_param.source must name the "
                                         r"list file$"):
        make_layer("ImageData", "image_data_param { batch_size: 1 }", name="img").SetUp([], [Blob(), Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): image '.*p0.png' \(list file '.*l.txt' "
                                         r"line 1\) is 4x6, smaller than crop_size 5$"):
        _image_layer(tmp_path, transform="crop_size: 5").SetUp([], [Blob(), Blob()])
    context.set_random_seed(0)
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): rand_skip drew \d+ but the list has only "
                                         r"2 lines$"):
        for seed in range(20):  # some draw % 1000 is >= 2
            context.set_random_seed(seed)
            layer = _image_layer(tmp_path, "rand_skip: 1000")
            layer.SetUp([], [Blob(), Blob()])
            layer.close()


def test_decode_gray_depths_and_alpha_like_opencv():
    """OpenCV's ANYCOLOR decode without ANYDEPTH: 16-bit gray to 8 bits (value / 256), 32-bit int or float
    gray kept when within 0..255 (else / 256), gray+alpha and 1-bit to gray; color stays BGR."""
    import io
    Image = pytest.importorskip("PIL.Image")
    from caffe.layers.data_transformer import decode_image_bytes

    def enc(img, fmt="PNG"):
        buf = io.BytesIO()
        img.save(buf, fmt)
        return buf.getvalue()

    v16 = np.array([[0, 255, 256, 1000, 65535]], np.uint16)
    got = decode_image_bytes(enc(Image.fromarray(v16)))
    np.testing.assert_array_equal(got, (v16 // 256).astype(np.uint8)[None])
    small = np.array([[0, 7, 200, 255]], np.int32)
    np.testing.assert_array_equal(decode_image_bytes(enc(Image.fromarray(small), "TIFF")), small[None])
    big = np.array([[0, 512, 1024, 65280]], np.int32)
    np.testing.assert_array_equal(decode_image_bytes(enc(Image.fromarray(big), "TIFF")),
                                  (big // 256)[None])
    f = np.array([[0.0, 3.0, 254.0]], np.float32)
    np.testing.assert_array_equal(decode_image_bytes(enc(Image.fromarray(f), "TIFF")), f[None])
    la = Image.fromarray(np.array([[[10, 0], [200, 255]]], np.uint8))
    np.testing.assert_array_equal(decode_image_bytes(enc(la)), [[[10, 200]]])
    one = Image.fromarray(np.array([[0, 255, 255]], np.uint8), "L").convert("1")
    np.testing.assert_array_equal(decode_image_bytes(enc(one)), [[[0, 255, 255]]])
    rgb = np.array([[[1, 2, 3]]], np.uint8)
    np.testing.assert_array_equal(decode_image_bytes(enc(Image.fromarray(rgb, "RGB")), force_color=True),
                                  [[[3]], [[2]], [[1]]])
    np.testing.assert_array_equal(decode_image_bytes(enc(Image.fromarray(v16[:, :1].astype(np.uint8), "L")),
                                                     force_gray=True), [[[0]]])


def _mean_proto(tmp_path, shape, values=None, double=False, name="m.binaryproto"):
    from caffe.proto import caffe_pb2
    p = caffe_pb2.BlobProto()
    p.shape.dim.extend(shape)
    vals = np.arange(int(np.prod(shape)), dtype=np.float64) if values is None else values
    (p.double_data if double else p.data).extend(vals.ravel().tolist())
    path = tmp_path / name
    path.write_bytes(p.SerializeToString())
    return str(path)


def test_load_mean_file_shapes_and_dtype(tmp_path):
    """Caffe keeps channels x height x width: leading 1s (num) dropped down to 3 axes only, a 2-d blob is one
    channel; double_data gives float32 like data."""
    from caffe.layers.data_transformer import load_mean_file
    for shape, want in [((1, 1, 4), (1, 1, 4)), ((1, 1, 1, 4), (1, 1, 4)), ((1, 1, 2, 3, 4), (2, 3, 4)),
                        ((3, 4), (1, 3, 4)), ((1, 1, 1), (1, 1, 1))]:
        got = load_mean_file(_mean_proto(tmp_path, shape))
        assert got.shape == want, shape
        np.testing.assert_array_equal(got.ravel(), np.arange(np.prod(shape)))
    got = load_mean_file(_mean_proto(tmp_path, (2, 2), np.array([0.1, 0.2, 0.3, 1e-50]), double=True))
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.array([[[0.1, 0.2], [0.3, 1e-50]]], np.float32))
    with pytest.raises(DataError, match=r"^mean_file '.*m.binaryproto' holds a blob of shape \(2, 1, 3, 4\); "
                                        r"expected \(1,\) C x H x W$"):
        load_mean_file(_mean_proto(tmp_path, (2, 1, 3, 4)))


def test_load_mean_file_too_big_names_the_format(tmp_path):
    """A mean file over protobuf's 2 GiB (a sparse file: no disk used) is refused before reading, naming the
    format whose limit it passes."""
    from caffe.layers.data_transformer import load_mean_file
    path = tmp_path / "huge.binaryproto"
    with open(path, "wb") as f:
        f.truncate((2 << 30) + 1)
    with pytest.raises(DataError, match=r"^cannot read mean_file '.*huge.binaryproto': it is .*, more than the "
                                        r"2\.0 GiB \(2147483647 bytes\) a BlobProto can hold$"):
        load_mean_file(str(path))


def _png_header_only(width, height):
    """A gray PNG whose header declares width x height pixels but whose data holds almost none."""
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 8)) + chunk(b"IEND", b""))


def test_decode_refuses_a_header_declaring_more_pixels_than_its_bytes_can_hold():
    """The bound is 8256 pixels per byte plus 1 Mi pixels: at the bound the image is decoded (and here found
    truncated); one row more is a corrupt header, refused before any allocation."""
    pytest.importorskip("PIL.Image")
    from caffe.layers.data_transformer import decode_image_bytes
    n = len(_png_header_only(1, 1))  # the same length whatever the size declared
    bound = 8256 * n + (1 << 20)
    assert bound % 2 == 0
    with pytest.raises(DataError) as at_bound:
        decode_image_bytes(_png_header_only(bound // 2, 2))
    assert "header" not in str(at_bound.value) and str(at_bound.value).startswith("image: cannot decode")
    with pytest.raises(DataError, match=rf"^image: cannot decode the encoded image \({n} bytes\): it declares "
                                        rf"{bound // 2 + 1}x2 pixels, more than so few bytes can encode: its "
                                        rf"header is corrupt$"):
        decode_image_bytes(_png_header_only(bound // 2 + 1, 2))
    with pytest.raises(DataError, match=r"^image: cannot set both force_color and force_gray$"):
        decode_image_bytes(_png_header_only(1, 1), force_color=True, force_gray=True)


@pytest.mark.parametrize("cores, want", [(None, 1), (1, 1), (3, 3), (8, 8), (64, 8)])
def test_decode_threads_one_per_core_at_most_8(monkeypatch, cores, want):
    from caffe.layers.data_transformer import decode_threads
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert decode_threads() == want


@pytest.mark.parametrize("threads, items, on_pool", [(1, 3, False), (2, 1, False), (2, 2, True), (3, 3, True)])
def test_parallel_map_uses_the_decode_pool_for_two_items_or_more(monkeypatch, threads, items, on_pool):
    """One item, or one decode thread: the caller's thread; else the decode pool of decode_threads() workers."""
    import threading
    from caffe.layers import base_data
    monkeypatch.setattr(base_data, "decode_threads", lambda: threads)
    monkeypatch.setattr(base_data, "_pool", None)  # a fresh pool, sized now (restored after the test)
    try:
        names = base_data.parallel_map(lambda x: (x, threading.current_thread().name), list(range(items)))
        assert [x for x, _ in names] == list(range(items))
        assert all(n.startswith("caffe-decode") == on_pool for _, n in names), names
        if on_pool:
            assert base_data._pool._max_workers == threads
    finally:
        if base_data._pool is not None:
            base_data._pool.shutdown()


def _mnist_like_lmdb(tmp_path, n=3):
    from caffe.layers.db import write_db
    path = str(tmp_path / "db")
    write_db(path, [(f"{i:08d}", array_to_datum(np.full((1, 2, 2), i, np.uint8), i).SerializeToString())
                    for i in range(n)])
    return path


def test_close_stops_the_prefetch_thread_and_closes_the_database(tmp_path):
    """close() (Caffe's StopInternalThread) joins the thread, whose thread_end closes the database; close()
    twice, or on a layer whose setup failed before its thread started, does nothing."""
    from caffe.layers import db as dbmod
    src = _mnist_like_lmdb(tmp_path)
    layer = make_layer("Data", f'data_param {{ source: "{src}" batch_size: 2 backend: LMDB }}', name="d")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    assert layer._thread.is_alive() and layer._db is not None
    layer.close()
    assert not layer._thread.is_alive()
    assert layer._db is None
    assert not [k for k in dbmod._SharedLMDB._envs if k[1] == os.path.realpath(src)]
    layer.close()
    bad = make_layer("Data", 'data_param { batch_size: 2 }', name="d")
    with pytest.raises(LayerError):
        bad.SetUp([], [Blob(), Blob()])
    bad.StopInternalThread()  # never started: nothing to stop


def test_read_image_refuses_a_fifo_naming_it_an_image(tmp_path):
    from caffe.layers.data_transformer import read_image
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs mkfifo")
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"^image '.*pipe.png': Cannot read image '.*pipe.png': it is a FIFO"):
        read_image(str(fifo))


def test_transformer_rng_without_random_transforms_is_seeded_from_the_runtime():
    """rng() (Caffe's Rand source) on a transformer that draws nothing itself: still a generator, seeded from
    the runtime one (reproducible under set_random_seed), made once."""
    from caffe.layers.data_transformer import DataTransformer
    tf = DataTransformer()
    context.set_random_seed(3)
    g = tf.rng()
    assert isinstance(g, np.random.Generator) and tf.rng() is g
    first = g.integers(0, 2**31, size=4)
    tf2 = DataTransformer()
    context.set_random_seed(3)
    np.testing.assert_array_equal(tf2.rng().integers(0, 2**31, size=4), first)


def test_read_list_file_blank_lines_and_paths_as_caffe(tmp_path):
    """A blank line is skipped (the lines after it still read); the path is everything before the last blank,
    leading blanks included (Caffe: line.substr(0, find_last_of(' '))); a bad line is quoted whole."""
    from caffe.layers.image_data_layer import read_list_file
    src = tmp_path / "l.txt"
    src.write_text("a.png 1\n\n  \n b c.png 2  \r\nd.png 3\n")
    assert read_list_file(str(src)) == [("a.png", 1, 1), (" b c.png", 2, 4), ("d.png", 3, 5)]
    src.write_text("a.png 1\nphotoX\n")
    with pytest.raises(DataError, match=r"^list file '.*l.txt' line 2: expected 'path label' \(an integer label "
                                        r"after the last space\), got 'photoX'$"):
        read_list_file(str(src))


def test_db_hints_an_lmdb_opened_as_leveldb_and_items_leaves_no_cursor(tmp_path):
    from caffe.layers import db
    src = _mnist_like_lmdb(tmp_path)
    with pytest.raises(db.DBError, match=r"^'.*db' is not a LevelDB database: it has no CURRENT file \(it looks "
                                         r"like an LMDB database: set backend: LMDB / -backend lmdb\)$"):
        db.open_db(src, "leveldb")
    with db.open_db(src, "lmdb") as d:
        assert [k for k, _ in d.items()] == [b"00000000", b"00000001", b"00000002"]
        assert len(list(d.items())) == 3 and d._cursors == []  # each walk's cursor closed and forgotten
        assert d.count() == 3


@pytest.mark.parametrize("rank, phase, extra, warned", [(1, "TRAIN", "", True), (2, "TRAIN", "", True),
                                                        (0, "TRAIN", "", False), (1, "TEST", "", False),
                                                        (1, "TRAIN", "rand_skip: 1", False),
                                                        (1, "TRAIN", "shuffle: true", False)])
def test_image_data_multi_gpu_warning(tmp_path, caplog, rank, phase, extra, warned):
    """Caffe warns a TRAIN ImageData of a solver other than the first that reads in order (no shuffle, no
    rand_skip): every GPU would see the same images."""
    import logging
    _image_list(tmp_path, 2)
    count, old = context.solver_count(), context.solver_rank()
    context.set_solver_count(3)
    context.set_solver_rank(rank)
    try:
        layer = make_layer("ImageData", f'image_data_param {{ source: "{tmp_path}/l.txt" root_folder: '
                                        f'"{tmp_path}/" batch_size: 1 {extra} }}', name="img",
                           phase=0 if phase == "TRAIN" else 1)
        with caplog.at_level(logging.WARNING, logger="caffe"):
            layer.SetUp([], [Blob(), Blob()])
        layer.close()
    finally:
        context.set_solver_rank(old)
        context.set_solver_count(count)
    got = [r.getMessage() for r in caplog.records if "multi-GPU" in r.getMessage()]
    assert got == (["Layer 'img' (ImageData): shuffling or skipping recommended for multi-GPU"] if warned else [])


def test_image_data_rand_skip_drawing_exactly_the_line_count_is_named(tmp_path):
    _image_list(tmp_path, 2)
    seed = next(s for s in range(100)
                if (context.set_random_seed(s) or int(context.rng().integers(0, 2**32)) % 3 == 2))
    context.set_random_seed(seed)
    with pytest.raises(LayerError, match=r"^Layer 'img' \(ImageData\): rand_skip drew 2 but the list has only "
                                         r"2 lines$"):
        _image_layer(tmp_path, "rand_skip: 3").SetUp([], [Blob(), Blob()])


@pytest.mark.parametrize("cols, rows, crop, square, mirror, win, context_pad", [
    (6, 9, 8, True, False, (5, 8, 5, 8), 1),   # clipped at the right and bottom, not at the top/left
    (9, 3, 5, True, True, (4, 2, 8, 2), 1),    # mirrored: the right padding on the left, rounding past crop
    (8, 3, 6, False, False, (5, 0, 6, 0), 2),  # top padding and warped height rounding past crop
    (5, 2, 7, True, False, (1, 1, 4, 1), 3),   # the top padding fills the crop: nothing left to warp (h 0)
])
def test_window_warp_clipped_windows_match_caffe(cols, rows, crop, square, mirror, win, context_pad):
    """Windows whose context reaches past the image's edges: the clipped region's size and the warped size
    capped at crop - padding, as Caffe's window_data_layer.cpp (cases the derandomized draws miss)."""
    layer = window_warper(crop, context_pad, square)
    img = _SpyImage(cols, rows)
    arr, pad_h, pad_w = layer._warp(img, [0, 1, 1.0, *win], mirror)
    box, size, want_h, want_w = caffe_window_geometry(win, cols, rows, crop, context_pad, square, mirror)
    assert (pad_h, pad_w) == (want_h, want_w)
    if min(size) <= 0:
        assert arr is None and img.calls == [] and size[0] > 0
        return
    x1, y1, x2, y2 = box
    assert img.calls == [("crop", (x1, y1, x2 + 1, y2 + 1)), ("resize", size)]
    assert arr.shape == (3, size[1], size[0])


def _records_db(tmp_path, values, backend="lmdb", name="rdb"):
    from caffe.layers.db import write_db
    path = str(tmp_path / name)
    write_db(path, [(f"{i:08d}", v) for i, v in enumerate(values)], backend)
    return path


def _data_layer(src, batch=1, extra="", transform="", backend="LMDB"):
    return make_layer("Data", f'data_param {{ source: "{src}" batch_size: {batch} backend: {backend} {extra} }} '
                              f'transform_param {{ {transform} }}', name="d")


def test_data_layer_setup_shapes_and_a_missing_source(tmp_path):
    src = _records_db(tmp_path, [array_to_datum(np.zeros((3, 2, 5), np.uint8), 1).SerializeToString()])
    layer = _data_layer(src, batch=4)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.close()
    assert top[0].shape == (4, 3, 2, 5) and top[1].shape == (4,)
    with pytest.raises(LayerError, match=r"^Layer 'd' \(Data\): data_param.source must name the database to "
                                         r"read$"):
        make_layer("Data", "data_param { batch_size: 2 }", name="d").SetUp([], [Blob()])
    with pytest.raises(LayerError, match=r"^Layer 'd' \(Data\): record '00000000' of LMDB '.*rdb' is 2x5, smaller "
                                         r"than crop_size 3$"):
        _data_layer(src, transform="crop_size: 3").SetUp([], [Blob(), Blob()])


def test_data_layer_force_encoded_color(tmp_path):
    """DataParameter's deprecated force_encoded_color decodes gray records as BGR (unless transform_param
    forces gray); without it an encoded gray record stays one channel."""
    import io
    Image = pytest.importorskip("PIL.Image")
    from caffe.proto import caffe_pb2
    buf = io.BytesIO()
    Image.fromarray(np.array([[7, 9]], np.uint8), "L").save(buf, "PNG")
    d = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=3)
    src = _records_db(tmp_path, [d.SerializeToString()])
    for extra, transform, channels in [("", "", 1), ("force_encoded_color: true", "", 3),
                                       ("force_encoded_color: true", "force_gray: true", 1)]:
        layer = _data_layer(src, extra=extra, transform=transform)
        top = [Blob(), Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        layer.close()
        assert top[0].shape == (1, channels, 1, 2), (extra, transform)
        np.testing.assert_array_equal(top[0].data[0, :, 0], [[7, 9]] * channels)


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_data_layer_errors_name_the_record_and_the_database_kind(tmp_path, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel")
    kind = {"lmdb": "LMDB", "leveldb": "LevelDB"}[backend]
    src = _records_db(tmp_path, [b"\xff\xff\xff"], backend)
    with pytest.raises(LayerError, match=rf"^Layer 'd' \(Data\): record '00000000' of {kind} '.*rdb' is not a "
                                         rf"valid serialized Datum \(3 bytes\)"):
        _data_layer(src, backend=backend.upper()).SetUp([], [Blob(), Blob()])
    bad = array_to_datum(np.zeros((1, 2, 2), np.uint8))
    bad.data = b"\0"  # 1 byte for a 1x2x2 shape: read on the per-record path
    src2 = _records_db(tmp_path, [array_to_datum(np.zeros((1, 2, 2), np.uint8)).SerializeToString(),
                                  bad.SerializeToString()], backend, name="rdb2")
    src3 = _records_db(tmp_path, [array_to_datum(np.zeros((1, 2, 2), np.uint8)).SerializeToString(),
                                  array_to_datum(np.zeros((1, 1, 1), np.uint8)).SerializeToString()], backend,
                       name="rdb3")
    for src, n, tail in [(src2, 2, r": Datum holds 1 bytes of data but its shape 1x2x2 needs 4$"),
                         (src3, 3, r" is 1x1, smaller than crop_size 2$")]:
        layer = _data_layer(src, backend=backend.upper(), transform="crop_size: 2")
        top = [Blob(), Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        with pytest.raises(LayerError, match=rf"^Layer 'd' \(Data\): record '00000001' of {kind} '.*rdb{n}'{tail}"):
            layer.Forward([], top)
        layer.close()


class _SlowPrefetch:
    """A prefetching layer whose thread spins (burns CPU) or sleeps (no CPU) before its first batch, until
    `release` is set or `sleep_s` has passed."""

    @staticmethod
    def make(mode, stall_cpu_s, sleep_s=0.0):
        import threading
        import time
        from caffe.layers.base_data import BasePrefetchingDataLayer
        from caffe.layers.testing import layer_param

        release = threading.Event()

        class Slow(BasePrefetchingDataLayer):
            def data_layer_setup(self, bottom, top):
                top[0].reshape([2, 3])

            def load_batch(self, batch):
                if mode == "spin":
                    while not release.is_set():
                        pass
                else:
                    time.sleep(sleep_s)
                batch.data[...] = 7.0

        Slow.stall_cpu_s = stall_cpu_s
        layer = Slow(layer_param("Slow", "data_param { prefetch: 1 }", name="slow"))
        return layer, release


def test_a_prefetch_thread_that_spins_without_delivering_fails_forward_with_stall_cpu_s():
    """With stall_cpu_s set (the tests' conftest sets it for every prefetching layer), Forward gives up on a
    thread that has burnt that much CPU without delivering a batch: PrefetchStalled, naming the layer, not a
    LayerError (a test expecting a data error must not take a hang for one)."""
    from caffe.layers.base_data import PrefetchStalled
    layer, release = _SlowPrefetch.make("spin", 0.2)
    top = [Blob()]
    try:
        layer.SetUp([], top)
        with pytest.raises(PrefetchStalled, match=r"^Layer 'slow' \(\w+\): the prefetch thread used "
                                                  r"[0-9.]+ s of CPU without delivering a batch \(stall_cpu_s = 0.2\)$"):
            layer.Forward([], top)
        assert not issubclass(PrefetchStalled, LayerError)
        assert layer._stop.is_set() and not layer._finalizer.alive  # told to stop, and not joined at exit
        thread = layer._thread
    finally:
        release.set()
        layer.close()
    thread.join(timeout=10)
    assert not thread.is_alive()  # released, it saw the stop


def test_a_prefetch_thread_that_waits_without_cpu_is_not_a_stall():
    """The bound is on CPU used while Forward waits, not on wall time: a thread that takes longer than the
    wait's 1 s poll while using no CPU (a slow disk, a loaded machine) still delivers."""
    layer, release = _SlowPrefetch.make("sleep", 0.2, sleep_s=1.3)
    top = [Blob()]
    try:
        layer.SetUp([], top)
        layer.Forward([], top)
        assert np.all(top[0].data == 7.0)
    finally:
        layer.close()


def test_the_tests_bound_every_prefetching_layer():
    """conftest.py sets stall_cpu_s for the tests (a mutant that never moves a cursor then fails in seconds,
    not at mutmut's timeout); the library's default (None, in the class body) waits as Caffe does."""
    from caffe.layers.base_data import BasePrefetchingDataLayer
    assert BasePrefetchingDataLayer.stall_cpu_s == 5.0


# -- session 7: the survivors of layers-14's retest ------------------------------------------------------------

def _encoded(img, fmt, **kw):
    import io
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


@pytest.mark.filterwarnings("ignore:IM image format is deprecated:DeprecationWarning")
def test_decode_of_16_bit_32_bit_and_float_gray_images_gives_8_bit_gray_as_opencv():
    """Every 16-bit layout Pillow opens (big-endian TIFF: I;16B, an IM file: I;16L, PNG: I;16, a 16-bit PGM:
    I) decodes to one channel of value >> 8, even when every value is below 256; 32-bit and float images are
    divided by 256 only when they exceed 255, then clipped to 0..255."""
    Image = pytest.importorskip("PIL.Image")
    from caffe.layers.data_transformer import decode_image_bytes
    a16 = np.array([[0, 255, 256, 1000], [40000, 65535, 300, 7]], np.uint16)
    want = (a16 >> 8).astype(np.uint8)[None]
    big = Image.frombytes("I;16B", (4, 2), a16.astype(">u2").tobytes())
    little = Image.frombytes("I;16L", (4, 2), a16.astype("<u2").tobytes())
    for data, mode in ((_encoded(big, "TIFF"), "I;16B"), (_encoded(little, "IM"), "I;16L"),
                       (_encoded(Image.fromarray(a16), "PNG"), "I;16")):
        assert Image.open(__import__("io").BytesIO(data)).mode == mode
        out = decode_image_bytes(data)
        assert out.dtype == np.uint8
        np.testing.assert_array_equal(out, want, err_msg=mode)
    small = np.array([[0, 255], [128, 7]], np.uint16)  # 16 bits, all below 256: still >> 8
    np.testing.assert_array_equal(decode_image_bytes(_encoded(Image.fromarray(small), "PNG")), np.zeros((1, 2, 2)))
    pgm = np.array([[0, 256], [512, 65535]], np.uint16)  # a 16-bit PGM opens as 'I'; its max is exactly 256 + ...
    data = b"P5 2 2 65535\n" + pgm.astype(">u2").tobytes()
    np.testing.assert_array_equal(decode_image_bytes(data), [[[0, 1], [2, 255]]])
    data = b"P5 2 1 65535\n" + np.array([256, 0], ">u2").tobytes()  # ... and here exactly 256: still divided
    np.testing.assert_array_equal(decode_image_bytes(data), [[[1, 0]]])
    i32 = Image.fromarray(np.array([[10, 70000], [100000, 5]], np.int32))  # 32-bit: / 256, then clipped at 255
    np.testing.assert_array_equal(decode_image_bytes(_encoded(i32, "TIFF")), [[[0, 255], [255, 0]]])
    f_small = Image.fromarray(np.array([[10.7, 200.2], [-5, 100.5]], np.float32))  # float <= 255: kept, clipped at 0
    np.testing.assert_array_equal(decode_image_bytes(_encoded(f_small, "TIFF")), [[[10, 200], [0, 100]]])
    f_big = Image.fromarray(np.array([[10.7, 600.2], [-5, 2000.5]], np.float32))  # float > 255: / 256
    np.testing.assert_array_equal(decode_image_bytes(_encoded(f_big, "TIFF")), [[[0, 2], [0, 7]]])


@pytest.mark.parametrize("transparency", [None, 1, bytes([255, 0, 128, 255])])
def test_decode_of_palette_images_gives_bgr_without_warnings(transparency):
    """A palette PNG decodes to its colors (BGR, 3 channels), with or without a transparency entry (alpha is
    dropped as OpenCV does); transparency given as bytes goes through RGBA, without Pillow's warning."""
    import warnings
    Image = pytest.importorskip("PIL.Image")
    from caffe.layers.data_transformer import decode_image_bytes
    img = Image.new("P", (2, 2))
    img.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 254, 9, 8, 7])
    img.putdata([0, 1, 2, 3])
    data = _encoded(img, "PNG", **({} if transparency is None else {"transparency": transparency}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = decode_image_bytes(data)
    rgb = np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 254], [9, 8, 7]]], np.uint8)
    np.testing.assert_array_equal(out, rgb[:, :, ::-1].transpose(2, 0, 1))


def test_datum_to_image_shapes_dtypes_defaults_and_force_gray():
    """A Datum with any zero dimension is refused, naming the shape; float_data comes back float32; the default
    `where` texts ('Datum', 'record'); infer_blob_shape gives num 1; force_gray reaches encoded Datums."""
    from caffe.proto import caffe_pb2
    from caffe.layers.data_transformer import DataTransformer, datum_to_image, parse_datum
    for c, h, w in ((0, 2, 3), (1, 0, 3), (1, 2, 0)):
        d = caffe_pb2.Datum(channels=c, height=h, width=w)
        with pytest.raises(DataError, match=rf"^Datum: Datum has a non-positive shape {c}x{h}x{w}$"):
            datum_to_image(d)
    d = array_to_datum(np.array([[[0.5, 1.25]]], np.float32))
    assert datum_to_image(d).dtype == np.float32
    tf = DataTransformer(caffe_pb2.TransformationParameter(), 0)
    bad = caffe_pb2.Datum(channels=1, height=0, width=1)
    with pytest.raises(DataError, match=r"^Datum: "):
        tf.image(bad)
    with pytest.raises(DataError, match=r"^Datum: "):
        tf.infer_blob_shape(bad)
    with pytest.raises(DataError, match=r"^record is not a valid serialized Datum"):
        parse_datum(b"\xff\xff\xff")
    assert tf.infer_blob_shape(array_to_datum(np.zeros((3, 4, 5), np.uint8))) == [1, 3, 4, 5]
    Image = pytest.importorskip("PIL.Image")
    rgb = np.array([[[200, 100, 50], [0, 0, 0]]], np.uint8)
    enc = caffe_pb2.Datum(encoded=True, data=_encoded(Image.fromarray(rgb), "PNG"))
    want = np.asarray(Image.fromarray(rgb).convert("L"))[None]
    np.testing.assert_array_equal(datum_to_image(enc, force_gray=True), want)
    np.testing.assert_array_equal(datum_to_image(enc), rgb[:, :, ::-1].transpose(2, 0, 1))  # color by default
    gray_tf = DataTransformer(caffe_pb2.TransformationParameter(force_gray=True), 0)
    np.testing.assert_array_equal(gray_tf.image(enc), want)


def test_data_batches_of_different_shapes_reshape_in_float32(tmp_path):
    """Each batch takes the shape of its first record (Caffe's per-batch InferBlobShape): the prefetched buffers
    are reshaped when it changes, in the top's dtype (the transform computed in float32, as Caffe)."""
    a = (np.arange(4, dtype=np.uint8).reshape(1, 2, 2) * 61 + 3)
    b = (np.arange(9, dtype=np.uint8).reshape(1, 3, 3) * 27 + 1)
    records = [array_to_datum(x, i).SerializeToString() for i, x in enumerate([a, a + 1, b, b + 2])]
    layer = _data_layer(_records_db(tmp_path, records), batch=2, transform="scale: 0.1 mean_value: 0.3")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    try:
        for want in ([a, a + 1], [b, b + 2], [a, a + 1]):
            layer.Forward([], top)
            want = (np.stack(want).astype(np.float32) - np.float32(0.3)) * np.float32(0.1)
            assert top[0].shape == want.shape and top[0].dtype == np.float32
            np.testing.assert_array_equal(top[0].data, want)
    finally:
        layer.close()


def test_forward_after_close_names_the_stopped_thread(tmp_path):
    layer = make_layer("Data", f'data_param {{ source: "{_mnist_like_lmdb(tmp_path)}" batch_size: 2 backend: LMDB '
                               f'prefetch: 1 }}', name="d")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    layer.close()
    for _ in range(2):  # and the same error again, at once
        with pytest.raises(LayerError, match=r"^Layer 'd' \(Data\): the prefetch thread stopped without "
                                             r"delivering data$"):
            layer.Forward([], top)


def test_a_prefetching_layer_without_load_batch_names_it():
    from caffe.layers.base_data import BasePrefetchingDataLayer
    from caffe.layers.testing import layer_param

    class NoLoad(BasePrefetchingDataLayer):
        def data_layer_setup(self, bottom, top):
            top[0].reshape([1])

    layer = NoLoad(layer_param("NoLoad", name="n"))
    top = [Blob()]
    layer.SetUp([], top)
    with pytest.raises(LayerError, match=r"^Layer 'n' \(\w+\): NotImplementedError: NoLoad must implement "
                                         r"load_batch$"):
        layer.Forward([], top)
    layer.close()


def test_window_data_reads_gray_images_in_color_and_subtracts_the_mean_where_padded(tmp_path):
    """WindowData reads every image in color (a gray one made 3 equal channels); with a mean_file, the mean's
    crop at the item's padding offset is subtracted from the warped region only (Caffe's window_data_layer)."""
    from caffe.blob.proto_io import array_to_blob_proto
    win = (1, 0.9, 0, 0, 5, 4)  # at the top-left corner: with context_pad 1, padded on both axes
    layer, _ = _window_setup(tmp_path, [win], "context_pad: 1", batch=1)
    Image = pytest.importorskip("PIL.Image")
    gray = np.random.default_rng(2).integers(0, 256, size=(10, 12)).astype(np.uint8)
    Image.fromarray(gray, "L").save(tmp_path / "im.png")
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    layer.close()
    item = top[0].data[0].copy()
    assert item.any() and (item[0] == item[1]).all() and (item[1] == item[2]).all()
    mean = np.arange(3 * 8 * 8, dtype=np.float32).reshape(1, 3, 8, 8)  # 8x8 for crop 6: offset 1
    (tmp_path / "m.binaryproto").write_bytes(array_to_blob_proto(mean).SerializeToString())
    layer, _ = _window_setup(tmp_path, [win], "context_pad: 1", batch=1,
                             transform=f'mean_file: "{tmp_path}/m.binaryproto"')
    Image.fromarray(gray, "L").save(tmp_path / "im.png")
    layer.SetUp([], top)
    layer.Forward([], top)
    layer.close()
    _, (w, h), pad_h, pad_w = caffe_window_geometry(win[2:], 12, 10, 6, 1, False, False)
    assert pad_h > 0 and pad_w > 0
    want = np.zeros_like(item)
    want[:, pad_h:pad_h + h, pad_w:pad_w + w] = mean[0, :, 1 + pad_h:1 + pad_h + h, 1 + pad_w:1 + pad_w + w]
    np.testing.assert_array_equal(item - top[0].data[0], want)


def test_window_file_ending_early_names_what_it_expected(tmp_path):
    """A window file cut after any token: the error names the token expected (at a window's start too, where
    the line number of the missing window is past the end); a root_folder defaults to none."""
    from caffe.layers.window_data_layer import parse_window_file
    tokens = "# 0 im.png 3 10 12 2 1 0.9 0 0 5 5 0 0.1 2 2 6 6".split()
    coords = "window coordinates x1 y1 x2 y2"
    window = ["a window's class index", "a window's overlap"] + [coords] * 4
    expected = ["an image index after '#'", "an image path", "channels", "height", "width",
                "the number of windows"] + window * 2
    f = tmp_path / "w.txt"
    for k, what in enumerate(expected, start=1):
        f.write_text(" ".join(tokens[:k]) + "\n")
        with pytest.raises(DataError, match=rf"^window file '.*w.txt': ended early, expected {what}$"):
            parse_window_file(str(f), "")
    f.write_text("\n".join(tokens) + "\n")
    images, windows = parse_window_file(str(f))
    assert images == {0: ("im.png", (3, 10, 12))} and len(windows) == 2


def test_window_data_draws_from_every_window_and_mirrors_half(tmp_path):
    """Windows are drawn uniformly from all of them (100 here: a draw range below 100 would miss some) and
    mirrored with probability 1/2: 256 items of one image, each the warp or its mirror."""
    wins = [(i, 0.9, 0, 0, 11, 9) for i in range(1, 101)]  # the whole image, labels 1..100
    layer, _ = _window_setup(tmp_path, wins, "mirror: true cache_images: true", batch=128, crop=6)
    context.set_random_seed(11)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    items, labels = [], []
    for _ in range(2):
        layer.Forward([], top)
        items.append(top[0].data.copy())
        labels.append(top[1].data.copy())
    layer.close()
    items, labels = np.concatenate(items), np.concatenate(labels)
    assert labels.max() >= 90 and len(set(labels.astype(int))) > 80
    plain = items[0]
    assert not np.array_equal(plain, plain[:, :, ::-1])
    same = [bool(np.array_equal(x, plain)) for x in items]
    assert all(s or np.array_equal(x, plain[:, :, ::-1]) for s, x in zip(same, items))
    assert abs(sum(same) - 128) < 24, sum(same)  # binomial(256, 1/2): sd 8; a 2/3 mirror rate gives about 43 off


def test_list_file_bad_line_quoted_with_its_trailing_blanks(tmp_path):
    from caffe.layers.image_data_layer import read_list_file
    (tmp_path / "l.txt").write_text("a.png 1\nb.png x \t\n")
    with pytest.raises(DataError, match=r"^list file '.*l.txt' line 2: expected 'path label' \(an integer label "
                                        r"after the last space\), got 'b.png x \\t'$"):
        read_list_file(str(tmp_path / "l.txt"))


def test_transform_batch_checks_each_item_and_names_it():
    """transform_batch checks the first item and every item shaped otherwise (crop_size allows other sizes),
    naming it 'item i' without a `where`; an empty list and more items than the batch holds are named."""
    from caffe.layers.data_transformer import DataTransformer
    from caffe.proto import caffe_pb2
    tf = DataTransformer(caffe_pb2.TransformationParameter(crop_size=3), 1)
    out = np.empty((2, 1, 3, 3), np.float32)
    big, small = np.zeros((1, 4, 4), np.uint8), np.zeros((1, 2, 5), np.uint8)
    for items, i in (([small, big], 0), ([big, small], 1)):
        with pytest.raises(DataError, match=rf"^DataTransformer: item {i} is 2x5, smaller than crop_size 3$"):
            tf.transform_batch(items, out)
    with pytest.raises(DataError, match=r"^DataTransformer: there is no datum to transform$"):
        tf.transform_batch([], out)
    with pytest.raises(DataError, match=r"^DataTransformer: 3 items do not fit a batch of 2$"):
        tf.transform_batch([big] * 3, out)
    with pytest.raises(DataError, match=r"^DataTransformer: item 1 is 1x2x5 but the batch holds 1x4x4 items"):
        DataTransformer().transform_batch([big, small], np.empty((2, 1, 4, 4), np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("caffe.layers.testing", fromlist=["gpu_available"]).gpu_available(),
                    reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")
def test_gpu_mode_pushes_into_reused_device_buffers_reshaped_with_the_batch(tmp_path):
    """In GPU mode the prefetch thread copies each batch into the batch's device buffers: the same buffers
    while the batch keeps its shape, new ones when a batch of another shape comes (one Batch: prefetch 1)."""
    a = np.arange(4, dtype=np.uint8).reshape(1, 2, 2) * 61 + 3
    b = np.arange(9, dtype=np.uint8).reshape(1, 3, 3) * 27 + 1
    items = [a, a + 1, a + 2, a + 3, b, b + 2]
    src = _records_db(tmp_path, [array_to_datum(x, i).SerializeToString() for i, x in enumerate(items)])
    context.set_mode_gpu()
    layer = _data_layer(src, batch=2, extra="prefetch: 1")
    top = [Blob(), Blob()]
    try:
        layer.SetUp([], top)
        bufs = []
        for k in range(5):  # batches: a a b a a
            layer.Forward([], top)
            first = (2 * k) % 6
            np.testing.assert_array_equal(top[0].data, np.stack(items[first:first + 2]))
            np.testing.assert_array_equal(top[1].data, [first, first + 1])
            batch = layer._batches[0]
            assert batch.pushed
            bufs.append((batch.gpu_data, batch.gpu_label))
        assert bufs[1][0] is bufs[0][0] and bufs[1][1] is bufs[0][1]  # same shape: reused
        assert bufs[2][0] is not bufs[1][0] and bufs[2][0].shape == (2, 1, 3, 3)
        assert bufs[4][0] is bufs[3][0] and bufs[4][1] is bufs[3][1]
    finally:
        layer.close()
        context.set_mode_cpu()


def test_lmdb_readers_share_one_read_only_unlocked_environment(tmp_path):
    """Readers of one LMDB in a process share one Environment, opened as Caffe's MDB_RDONLY without the lock
    file (no writes: many reader processes), without readahead, for up to 1024 readers; the last release
    closes it."""
    import os
    from caffe.layers import db as dbmod
    src = _mnist_like_lmdb(tmp_path)
    env = dbmod._SharedLMDB.acquire(src)
    try:
        flags = env.flags()
        assert flags["readonly"] and flags["subdir"] and not flags["lock"] and not flags["readahead"]
        assert env.info()["max_readers"] == 1024
        assert dbmod._SharedLMDB.acquire(src) is env
        dbmod._SharedLMDB.release(env)
        assert (os.getpid(), os.path.realpath(src)) in dbmod._SharedLMDB._envs  # one holder left: still open
        assert env.stat()["entries"] == 3
    finally:
        dbmod._SharedLMDB.release(env)
    assert (os.getpid(), os.path.realpath(src)) not in dbmod._SharedLMDB._envs
    # two databases: releasing the second leaves the first open
    first = dbmod._SharedLMDB.acquire(src)
    (tmp_path / "two").mkdir()
    second = dbmod._SharedLMDB.acquire(_mnist_like_lmdb(tmp_path / "two", n=2))
    dbmod._SharedLMDB.release(second)
    assert first.stat()["entries"] == 3
    assert dbmod._SharedLMDB.acquire(src) is first  # still the shared one
    dbmod._SharedLMDB.release(first)
    dbmod._SharedLMDB.release(first)


def test_transform_batch_crops_the_mean_with_the_image_and_refuses_no_channels(tmp_path):
    """With crop_size, the mean is cropped at the item's offsets (TEST: the centre) before it is subtracted;
    an item with no channels is named."""
    from caffe.layers.data_transformer import DataTransformer
    from caffe.proto import caffe_pb2
    mean = _mean_proto(tmp_path, [1, 1, 4, 5])
    tf = DataTransformer(caffe_pb2.TransformationParameter(crop_size=2, mean_file=mean), 1)
    img = (np.arange(20, dtype=np.uint8).reshape(1, 4, 5) * 7) % 251
    out = np.empty((2, 1, 2, 2), np.float32)
    tf.transform_batch([img, img + 1], out)
    m = np.arange(20, dtype=np.float32).reshape(1, 4, 5)
    for k in range(2):
        np.testing.assert_array_equal(out[k], (img + k - m)[:, 1:3, 1:3])
    # the per-item path (map_fn: encoded images on the decode pool) crops and mirrors the mean the same way
    outs = []
    for map_fn in (None, lambda fn, items: [fn(i) for i in items]):
        context.set_random_seed(3)
        mirrored = DataTransformer(caffe_pb2.TransformationParameter(crop_size=2, mean_file=mean, mirror=True), 1)
        outs.append(np.empty((4, 1, 2, 2), np.float32))
        mirrored.transform_batch([img, img + 1, img + 2, img + 3], outs[-1], map_fn=map_fn)
    np.testing.assert_array_equal(outs[1], outs[0])
    assert not np.array_equal(outs[0][0], out[0]) or not np.array_equal(outs[0][1], out[1])  # some mirrored
    with pytest.raises(DataError, match=r"^DataTransformer: item 0 has no channels$"):
        DataTransformer().transform_batch([np.zeros((0, 4, 4), np.uint8)], np.empty((1, 0, 4, 4), np.float32))


def _lmdb_data_file(folder, psize, last_pg, size, txns=(1, 2), last_pgs=None, version=1):
    """A data.mdb of `size` bytes holding LMDB's two meta pages (page size psize) and nothing else."""
    from caffe.layers import db as dbmod
    folder.mkdir(exist_ok=True)
    buf = bytearray(size)
    for k, (txn, last) in enumerate(zip(txns, last_pgs or (last_pg, last_pg))):
        if k * psize + 16 + dbmod._META.size <= size:
            dbmod._META.pack_into(buf, k * psize + 16, dbmod._LMDB_MAGIC, version, 1 << 20, psize, 0, last, txn)
    (folder / "data.mdb").write_bytes(bytes(buf))
    return str(folder)


def test_lmdb_file_check_page_size_bounds_the_newer_meta_and_its_errors(tmp_path):
    """check_lmdb_file: page sizes 512 and 65536 (powers of two) are LMDB's bounds, both accepted; the meta
    page with the newer transaction gives the last page; a missing data.mdb and another format version are
    named."""
    from caffe.layers.db import DBError, check_lmdb_file
    check_lmdb_file(_lmdb_data_file(tmp_path / "a", 512, 3, 4 * 512))
    check_lmdb_file(_lmdb_data_file(tmp_path / "b", 65536, 1, 2 * 65536))
    for psize in (256, 1000, 131072):
        with pytest.raises(DBError, match=rf"is corrupt: its meta page gives a page size of {psize}$"):
            check_lmdb_file(_lmdb_data_file(tmp_path / f"p{psize}", psize, 1, 2 * 131072))
    # the second meta page is newer and names page 9: a file of 4 pages is cut short
    short = _lmdb_data_file(tmp_path / "c", 512, 3, 4 * 512, txns=(1, 2), last_pgs=(3, 9))
    with pytest.raises(DBError, match=r"is truncated: its last page \(9, of 512 bytes\) ends at byte 5120, but the "
                                      r"file holds only 2048 bytes"):
        check_lmdb_file(short)
    check_lmdb_file(_lmdb_data_file(tmp_path / "d", 512, 3, 4 * 512, txns=(2, 1), last_pgs=(3, 9)))  # older
    check_lmdb_file(_lmdb_data_file(tmp_path / "g", 512, 3, 4 * 512, txns=(2, 2), last_pgs=(3, 9)))  # as new
    with pytest.raises(DBError, match=r"is corrupt: its meta page names page 281474976710656 as the last one$"):
        check_lmdb_file(_lmdb_data_file(tmp_path / "h", 512, 1 << 48, 4 * 512))
    with pytest.raises(DBError, match=r"^LMDB database '.*e' \(.*data.mdb, .*\) has LMDB data format version 2; "
                                      r"this LMDB reads version 1$"):
        check_lmdb_file(_lmdb_data_file(tmp_path / "e", 512, 3, 4 * 512, version=2))
    (tmp_path / "f").mkdir()
    with pytest.raises(DBError, match=r"^LMDB database '.*f': Cannot open LMDB data file '.*data.mdb': no such "
                                      r"file$"):
        check_lmdb_file(str(tmp_path / "f"))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("caffe.layers.testing", fromlist=["gpu_available"]).gpu_available(),
                    reason="no GPU (CuPy with a CUDA device, or the CuPy stand-in)")
def test_gpu_mode_uploads_a_batch_loaded_before_the_switch(tmp_path):
    """A batch the thread loaded in CPU mode (not pushed) is handed to the tops from the host on the first
    GPU-mode Forward; the batches loaded after it come pushed. (The wait makes the order certain: the other
    tests reach this path only when the thread is slower than the switch.)"""
    import time
    items = [np.full((1, 2, 2), 10 * i, np.uint8) for i in range(6)]
    src = _records_db(tmp_path, [array_to_datum(x, i).SerializeToString() for i, x in enumerate(items)])
    layer = _data_layer(src, batch=2, extra="prefetch: 2")
    top = [Blob(), Blob()]
    try:
        layer.SetUp([], top)
        layer.Forward([], top)
        for _ in range(6000):  # until the thread has loaded the next batch (in CPU mode)
            if layer._full.qsize():
                break
            time.sleep(0.01)
        context.set_mode_gpu()
        pushed = []
        for k in range(1, 4):
            layer.Forward([], top)
            pushed.append(layer._current.pushed)
            first = (2 * k) % 6
            np.testing.assert_array_equal(top[0].data, np.stack(items[first:first + 2]))
            np.testing.assert_array_equal(top[1].data, [first, first + 1])
        assert pushed == [False, True, True]
    finally:
        layer.close()
        context.set_mode_cpu()


def test_lmdb_errors_pass_other_exceptions_through():
    """Only LMDB's own errors become a DBError naming the database; any other exception is not swallowed."""
    from caffe.layers import db as dbmod
    with pytest.raises(KeyError):
        with dbmod._lmdb_errors("some.lmdb", "reading"):
            raise KeyError("x")


# -- session 8: the survivors of layers-14's resume (db's DBWriter and open_db, base_data's prefetch setup,
# DataTransformer's construction) --------------------------------------------------------------------------

def test_array_to_datum_refuses_other_than_three_axes():
    with pytest.raises(DataError, match=r"^array_to_datum: expected a \(C, H, W\) array, got shape \(2, 3\)$"):
        array_to_datum(np.zeros((2, 3), np.uint8))


def test_open_db_errors_name_the_kind_asked(tmp_path):
    """open_db's errors say which kind of database was asked for (LevelDB is the default of data_param)."""
    from caffe.layers import db
    with pytest.raises(db.DBError, match=r"^no LevelDB database path given$"):
        db.open_db("", "leveldb")
    with pytest.raises(db.DBError, match=r"^no LMDB database path given$"):
        db.open_db("", "lmdb")
    with pytest.raises(db.DBError, match=r"^LevelDB database '.*nowhere' does not exist$"):
        db.open_db(str(tmp_path / "nowhere"), "leveldb")
    (tmp_path / "f").write_text("x")
    with pytest.raises(db.DBError, match=r"^LevelDB database '.*f' is not a folder \(Caffe's databases are "
                                         r"folders\)$"):
        db.open_db(str(tmp_path / "f"), "leveldb")


def test_leveldb_reader_closes_twice_and_a_second_open_is_named(tmp_path):
    """LevelDB allows one open handle per database: a second reader's error names the database; closing a
    reader twice (close, then the `with`'s exit) is quiet, as is closing one that never opened."""
    pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    from caffe.layers import db
    path = str(tmp_path / "ldb")
    db.write_db(path, [("a", b"1"), ("b", b"2")], "leveldb")
    with db.open_db(path, "leveldb") as d:
        assert list(d.items()) == [(b"a", b"1"), (b"b", b"2")]
        with pytest.raises(db.DBError, match=rf"^cannot open LevelDB database '{path}': .*lock"):
            db.open_db(path, "leveldb")
        d.close()
    d.close()
    db.DB(path, "leveldb").close()  # never opened (its open failed): nothing to close
    with db.open_db(path, "leveldb") as again:  # the handle was released: it opens again
        assert again.count() is None and not again.is_empty()


def test_db_writer_close_twice_returns_the_path(tmp_path):
    """close() is idempotent: inside a `with`, a close before the exit leaves the database in place."""
    from caffe.layers import db
    path = str(tmp_path / "w_db")
    with db.DBWriter(path) as w:
        w.put("k", b"v")
        assert w.close() == path
        assert w.close() == path
    with db.open_db(path) as d:
        assert list(d.items()) == [(b"k", b"v")]
    assert os.listdir(tmp_path) == ["w_db"]


def _commit_sizes(db, monkeypatch):
    """A list that records the number of records of each DBWriter commit that writes any."""
    sizes = []
    real = db.DBWriter.commit

    def commit(self):
        if self._pending:
            sizes.append(len(self._pending))
        real(self)
    monkeypatch.setattr(db.DBWriter, "commit", commit)
    return sizes


def test_write_db_commits_every_batch_records(tmp_path, monkeypatch):
    """write_db commits every `batch` records (Caffe's convert_imageset: 1000 by default), bounding what a
    writer holds in memory."""
    from caffe.layers import db
    sizes = _commit_sizes(db, monkeypatch)
    recs = [(f"{i:08d}", b"v") for i in range(2001)]
    assert db.write_db(str(tmp_path / "a"), recs) == 2001
    assert sizes == [1000, 1000, 1]
    sizes.clear()
    assert db.write_db(str(tmp_path / "b"), recs[:25], batch=10) == 25
    assert sizes == [10, 10, 5]


def test_a_dead_writers_leftover_that_cannot_be_removed_does_not_stop_the_next_writer(tmp_path):
    """The clean-up of dead writers' partial folders is best effort: a leftover it cannot remove (here a file
    with a partial folder's name) is left, and the new database is written."""
    import subprocess
    import sys
    from caffe.layers import db
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".t_db.partial-{dead}-0123abcd").write_text("not a folder")
    db.write_db(str(tmp_path / "t_db"), [(b"k", b"v")])
    with db.open_db(str(tmp_path / "t_db")) as d:
        assert list(d.items()) == [(b"k", b"v")]


def test_db_writer_batch_bounds_and_its_partial_folder_beside_the_target(tmp_path, monkeypatch):
    """DBWriter commits every `batch` records (1000 by default, at least 1); it writes into a hidden folder
    beside the target named as the next writer's clean-up recognises it (`.<name>.partial-<pid>-<8 hex>`);
    an empty path is refused."""
    import re
    from caffe.layers import db
    sizes = _commit_sizes(db, monkeypatch)
    w = db.DBWriter(str(tmp_path / "w_db"))
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(w.tmp_path)]
    assert re.fullmatch(rf"\.w_db\.partial-{os.getpid()}-[0-9a-f]{{8}}", os.path.basename(w.tmp_path))
    assert db._PARTIAL_RE.match(os.path.basename(w.tmp_path)).group("base") == "w_db"
    for i in range(1001):
        w.put(f"{i:08d}", b"v")
    w.close()
    assert sizes == [1000, 1]
    for batch, want in ((1, [1, 1, 1]), (0, [1, 1, 1]), (2, [2, 1])):
        sizes.clear()
        with db.DBWriter(str(tmp_path / f"b{batch}"), batch=batch) as w:
            for i in range(3):
                w.put(f"{i}", b"v")
        assert sizes == want, batch
    with pytest.raises(db.DBError, match=r"^no output database path given$"):
        db.DBWriter("")


def test_backend_name_refuses_other_numbers():
    from caffe.layers import db
    with pytest.raises(db.DBError, match=r"^unknown database backend 2: expected LMDB \(1\) or LEVELDB \(0\)$"):
        db.backend_name(2)


def test_an_abandoned_or_failed_writer_leaves_no_partial_folder(tmp_path, monkeypatch):
    """A writer dropped without close() removes its partial folder (no database appears); one whose setup
    failed removes it at once, even while the caller holds the exception (and with it the writer); one that
    failed before making it has nothing to remove and says nothing on the way out."""
    import gc
    import sys
    from caffe.layers import db
    w = db.DBWriter(str(tmp_path / "a_db"))
    w.put("k", b"v")
    del w
    gc.collect()
    assert os.listdir(tmp_path) == []
    monkeypatch.setitem(sys.modules, "plyvel", None)
    try:
        db.DBWriter(str(tmp_path / "l_db"), "leveldb")
    except db.DBError as exc:
        held = exc  # its traceback keeps the half-made writer alive
    assert held.__traceback__ is not None and os.listdir(tmp_path) == []
    del held
    (tmp_path / "exists").mkdir()
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(db.DBError, match="already exists"):
        db.DBWriter(str(tmp_path / "exists"))
    gc.collect()
    assert unraisable == []


@pytest.mark.parametrize("mirror, phase, crop, draws", [(True, 1, 0, True), (False, 0, 2, True), (False, 0, 1, True),
                                                         (False, 1, 2, False), (False, 0, 0, False)])
def test_transformer_init_rand_draws_a_seed_only_when_it_draws(mirror, phase, crop, draws):
    """Caffe's InitRand: the transformer takes a seed from the runtime generator only when it draws itself
    (mirror, or a TRAIN-phase crop, of any size); otherwise the runtime stream is left as it was (the other
    layers' draws stay where they were)."""
    from caffe.layers.data_transformer import DataTransformer
    from caffe.proto import caffe_pb2
    tf = DataTransformer(caffe_pb2.TransformationParameter(mirror=mirror, crop_size=crop), phase)
    context.set_random_seed(7)
    state = context.rng().bit_generator.state
    tf.init_rand()
    assert (context.rng().bit_generator.state != state) is draws
    assert (tf._rng is not None) is draws


def test_transformer_defaults_to_train_and_refuses_mean_file_with_mean_value(tmp_path):
    """A DataTransformer made without a phase is a TRAIN one (crops drawn at random, as Caffe's default
    phase); a mean_file and mean_values together are refused, naming the transformer."""
    from caffe.layers.data_transformer import DataTransformer
    from caffe.proto import caffe_pb2
    tf = DataTransformer(caffe_pb2.TransformationParameter(crop_size=2))
    context.set_random_seed(1)
    img = np.arange(36, dtype=np.uint8).reshape(1, 6, 6)
    out = np.empty((16, 1, 2, 2), np.float32)
    tf.transform_batch([img] * 16, out)
    assert len({o.tobytes() for o in out}) > 1  # offsets drawn, not the centre every time
    p = caffe_pb2.TransformationParameter(mean_file=_mean_proto(tmp_path, [1, 1, 6, 6]), mean_value=[1.0])
    with pytest.raises(DataError, match=r"^Layer 'd' \(Data\): cannot specify transform_param mean_file and "
                                        r"mean_value at the same time$"):
        DataTransformer(p, 1, name="Layer 'd' (Data)")


@pytest.mark.parametrize("param, count", [("", 4), ("data_param { }", 4), ("data_param { prefetch: 2 }", 2),
                                          ("data_param { prefetch: 1 }", 1), ("data_param { prefetch: 0 }", 1)])
def test_prefetching_layers_load_data_param_prefetch_batches_ahead(param, count):
    """Caffe's data_param.prefetch (default 4; a layer without data_param, as ImageData, uses the default):
    the thread fills that many batches ahead, at least one."""
    import time
    from caffe.layers.base_data import BasePrefetchingDataLayer
    from caffe.layers.testing import layer_param

    class Ones(BasePrefetchingDataLayer):
        def data_layer_setup(self, bottom, top):
            top[0].reshape([2, 3])

        def load_batch(self, batch):
            batch.data[...] = 1.0

    layer = Ones(layer_param("Ones", param, name="ones"))
    top = [Blob()]
    try:
        layer.SetUp([], top)
        assert layer.prefetch_count() == count and len(layer._batches) == count
        for _ in range(1000):
            if layer._full.qsize() == count:
                break
            time.sleep(0.01)
        assert layer._full.qsize() == count
        layer.Forward([], top)
        assert top[0].shape == (2, 3) and np.all(top[0].data == 1.0)
    finally:
        layer.close()
