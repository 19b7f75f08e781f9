"""HDF5Data against Caffe's own test fixtures (sample_data.h5, sample_data_2_gzip.h5) and HDF5Output."""
import pathlib

import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.layers import LayerError
from caffe.layers.testing import make_layer

h5py = pytest.importorskip("h5py")

SHARED = pathlib.Path(__file__).resolve().parents[3].parent / "shared"
FIXTURES = SHARED / "caffe-models" / "test_data"


def fixtures():
    if not (FIXTURES / "sample_data.h5").exists():
        pytest.skip("shared/caffe-models/test_data is absent: Caffe's HDF5 fixtures are not here")
    return FIXTURES


def hdf5_layer(source, batch, tops=("data", "label", "label2"), shuffle=False, phase=0):
    lay = make_layer("HDF5Data", f'hdf5_data_param {{ source: "{source}" batch_size: {batch} '
                                 f'shuffle: {str(shuffle).lower()} }}', phase=phase)
    lay.layer_param.top.extend(tops)
    return lay


def two_file_list(tmp_path):
    d = fixtures()
    lst = tmp_path / "list.txt"
    lst.write_text(f"{d / 'sample_data.h5'}\n{d / 'sample_data_2_gzip.h5'}\n")
    return lst


def test_fixture_contents_as_caffe_test_expects():
    d = fixtures()
    with h5py.File(d / "sample_data.h5", "r") as f:
        assert f["data"].shape == (10, 8, 6, 5) and f["label"].shape == (10, 1)
        np.testing.assert_array_equal(f["data"][...].ravel(), np.arange(2400))
    with h5py.File(d / "sample_data_2_gzip.h5", "r") as f:
        assert f["data"].compression == "gzip" and f["label"].dtype == np.uint8
    assert "sample_data.h5" in (d / "sample_data_list.txt").read_text()


def test_reads_rows_across_files_and_wraps(tmp_path):
    """Caffe's HDF5DataLayerTest.TestRead: batches of 5 rows, file 1 then file 2 (gzip) and around."""
    layer = hdf5_layer(two_file_list(tmp_path), 5)
    top = [Blob(), Blob(), Blob()]
    layer.SetUp([], top)
    assert top[0].shape == (5, 8, 6, 5) and top[1].shape == (5, 1) and top[2].shape == (5, 1)
    for it in range(10):
        layer.Forward([], top)
        file_offset = 0 if it % 4 < 2 else 2400  # file 2's data continue at 2400
        row0 = 5 * (it % 2)
        np.testing.assert_array_equal(top[1].data.ravel(), np.arange(row0, row0 + 5) + 1)
        np.testing.assert_array_equal(top[2].data.ravel(), np.arange(row0, row0 + 5) + 2)
        np.testing.assert_array_equal(top[0].data.ravel(), file_offset + 240 * row0 + np.arange(1200))
    assert top[0].dtype == np.float32


def test_float64_tops_and_a_batch_spanning_files(tmp_path):
    layer = hdf5_layer(two_file_list(tmp_path), 7, tops=("label",))
    top = [Blob(dtype=np.float64)]
    layer.SetUp([], top)
    seen = []
    for _ in range(3):
        layer.Forward([], top)
        seen += list(top[0].data.ravel())
    assert top[0].dtype == np.float64
    assert seen == [float(i % 10 + 1) for i in range(21)]  # both files hold labels 1..10


def test_shuffle_serves_every_row_once_per_pass(tmp_path):
    context.set_random_seed(5)
    layer = hdf5_layer(two_file_list(tmp_path), 10, tops=("data",), shuffle=True)
    top = [Blob()]
    layer.SetUp([], top)
    firsts = []
    for _ in range(2):
        layer.Forward([], top)
        firsts += list(top[0].data[:, 0, 0, 0] // 240)
    assert sorted(firsts) == list(range(20))  # 10 rows of each file (values 0..2399, 2400..4799)


def test_sharding_by_rank(tmp_path):
    try:
        context.set_solver_count(2)
        context.set_solver_rank(1)
        layer = hdf5_layer(two_file_list(tmp_path), 5, tops=("label",))
        top = [Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        assert list(top[0].data.ravel()) == [2, 4, 6, 8, 10]  # rows 1, 3, 5, 7, 9
    finally:
        context.set_solver_count(1)
        context.set_solver_rank(0)


def test_bad_input(tmp_path):
    d = fixtures()
    lst = tmp_path / "l.txt"
    lst.write_text(f"{d / 'sample_data.h5'}\n")
    with pytest.raises(LayerError, match=r"HDF5 file '.*sample_data.h5' has no dataset 'nope' for top 'nope' "
                                         r"\(datasets: data, label, label2\)"):
        hdf5_layer(lst, 2, tops=("data", "nope")).SetUp([], [Blob(), Blob()])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(LayerError, match="lists no files"):
        hdf5_layer(empty, 2, tops=("data",)).SetUp([], [Blob()])
    missing = tmp_path / "m.txt"
    missing.write_text(str(tmp_path / "gone.h5"))
    with pytest.raises(LayerError, match="HDF5 file '.*gone.h5' \\(listed in '.*m.txt'\\) does not exist"):
        hdf5_layer(missing, 2, tops=("data",)).SetUp([], [Blob()])
    ragged = tmp_path / "ragged.h5"
    with h5py.File(ragged, "w") as f:
        f["data"] = np.zeros((4, 2))
        f["label"] = np.zeros(3)
    rl = tmp_path / "r.txt"
    rl.write_text(str(ragged))
    with pytest.raises(LayerError, match="dataset 'label' has 3 rows but 'data' has 4"):
        hdf5_layer(rl, 2, tops=("data", "label")).SetUp([], [Blob(), Blob()])


def test_hdf5_output_round_trip(tmp_path):
    out = tmp_path / "out.h5"
    layer = make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{out}" }}')
    rng = np.random.default_rng(0)
    data = [rng.normal(size=(3, 2, 4, 5)).astype(np.float32) for _ in range(2)]
    labels = [rng.integers(0, 9, size=(3,)).astype(np.float32) for _ in range(2)]
    bottom = [Blob(3, 2, 4, 5), Blob(3)]
    layer.SetUp(bottom, [])
    for x, y in zip(data, labels):
        bottom[0].data[...] = x
        bottom[1].data[...] = y
        layer.Forward(bottom, [])
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["data"][...], np.concatenate(data))
        np.testing.assert_array_equal(f["label"][...], np.concatenate(labels).reshape(6, 1, 1, 1))
        assert f["data"].dtype == np.float32
    # what HDF5Output writes, HDF5Data reads back
    (tmp_path / "list.txt").write_text(str(out))
    back = hdf5_layer(tmp_path / "list.txt", 6, tops=("data", "label"))
    top = [Blob(), Blob()]
    back.SetUp([], top)
    back.Forward([], top)
    np.testing.assert_array_equal(top[0].data, np.concatenate(data))


def test_hdf5_output_errors(tmp_path):
    with pytest.raises(LayerError, match="file_name must name"):
        make_layer("HDF5Output").SetUp([Blob(1), Blob(1)], [])
    with pytest.raises(LayerError, match="folder '.*nowhere' does not exist"):
        make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{tmp_path}/nowhere/o.h5" }}').SetUp(
            [Blob(1), Blob(1)], [])
    layer = make_layer("HDF5Output", f'hdf5_output_param {{ file_name: "{tmp_path}/o.h5" }}')
    bottom = [Blob(2, 3), Blob(3)]
    layer.SetUp(bottom, [])
    with pytest.raises(LayerError, match="data and label must have the same num"):
        layer.Forward(bottom, [])
