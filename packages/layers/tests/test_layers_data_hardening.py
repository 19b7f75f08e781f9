"""Damaged inputs to the data layers get clear errors, never a crash: a truncated or corrupt LMDB (which LMDB
itself answers with SIGBUS or a bare MDB_CORRUPTED), HDF5 datasets of strings or groups, FIFOs as list files."""
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from caffe.blob import Blob
from caffe.layers import LayerError, db
from caffe.layers.data_transformer import DataError, array_to_datum, load_mean_file
from caffe.layers.testing import make_layer


def _digits_lmdb(path, n=600):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    db.write_db(str(path), ((f"{i:08d}", array_to_datum(images[i], i % 10).SerializeToString())
                            for i in range(n)))
    return str(path)


def _last_page(path):
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        head = f.read(8192)
    psize = struct.unpack_from("<I", head, 40)[0]
    metas = [struct.unpack_from("<QQ", head, off + 136) for off in (0, psize)]  # (last_pg, txnid)
    return max(metas, key=lambda m: m[1])[0], psize


def _read_all_in_child(path):
    """Read every record in a child: a regression to LMDB's SIGBUS must fail this test, not kill pytest."""
    code = textwrap.dedent(f"""
        from caffe.layers import db
        try:
            with db.open_db({path!r}) as d:
                print(sum(1 for _ in d.items()))
        except db.DBError as exc:
            print("DBError:", exc)
        """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_truncated_lmdb_is_refused_not_sigbus(tmp_path):
    path = _digits_lmdb(tmp_path / "train_lmdb")
    last_pg, psize = _last_page(path)
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    assert size == (last_pg + 1) * psize
    os.truncate(os.path.join(path, "data.mdb"), size // 3)  # the case: cut to a third
    proc = _read_all_in_child(path)
    assert proc.returncode == 0, f"the reader died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    assert f"DBError: LMDB database '{path}'" in proc.stdout
    assert (f"is truncated: its last page ({last_pg}, of {psize} bytes) ends at byte {size}, but the file holds "
            f"only {size // 3} bytes") in proc.stdout


@pytest.mark.parametrize("cut", ["inside_first_page", "inside_second_meta", "empty"])
def test_lmdb_cut_inside_its_meta_pages(tmp_path, cut):
    path = _digits_lmdb(tmp_path / "db", n=5)
    size = {"inside_first_page": 100, "inside_second_meta": 4100, "empty": 0}[cut]
    os.truncate(os.path.join(path, "data.mdb"), size)
    with pytest.raises(db.DBError, match=rf"LMDB database '{path}' .*(is truncated|not an LMDB data file)"):
        db.open_db(path)


def test_lmdb_data_file_that_is_not_lmdb(tmp_path):
    path = tmp_path / "db"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"GIF89a" + b"\0" * 9000)
    with pytest.raises(db.DBError, match="is not an LMDB data file of this machine"):
        db.open_db(str(path))


def test_corrupt_lmdb_page_names_the_database_and_the_layer(tmp_path):
    path = _digits_lmdb(tmp_path / "db")
    last_pg, psize = _last_page(path)
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek((last_pg // 2) * psize)
        f.write(b"\xff" * 32)  # a page header in the middle of the tree
    proc = _read_all_in_child(path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"DBError: LMDB database '{path}' is corrupt or unreadable: " in proc.stdout
    assert "MDB_CORRUPTED" in proc.stdout or "MDB_PAGE_NOTFOUND" in proc.stdout
    # through the Data layer: the layer is named too
    layer = make_layer("Data", f'data_param {{ source: "{path}" batch_size: 64 backend: LMDB }}', phase=1)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    try:
        with pytest.raises(LayerError, match=rf"Layer '\w+' \(Data\): LMDB database '{path}' is corrupt"):
            for _ in range(20):
                layer.Forward([], top)
    finally:  # stop the prefetch thread: left running, it outlives the test (and races mutmut's tracer)
        layer.close()


def _h5(path, **datasets):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            if isinstance(value, str) and value == "group":
                f.create_group(name)
            else:
                f.create_dataset(name, data=value)
    return str(path)


def _hdf5_layer(tmp_path, h5file):
    listing = tmp_path / "list.txt"
    listing.write_text(h5file + "\n")
    return make_layer("HDF5Data", f'top: "data" top: "label" hdf5_data_param {{ source: "{listing}" '
                                  f'batch_size: 2 }}')


def test_hdf5_string_dataset_names_the_file_and_dataset(tmp_path):
    f = _h5(tmp_path / "a.h5", data=np.array([b"abc", b"def"]), label=np.zeros(2, np.float32))
    with pytest.raises(LayerError, match=r"HDF5 file '.*a.h5' dataset 'data' holds strings, not numbers"):
        _hdf5_layer(tmp_path, f).SetUp([], [Blob(), Blob()])


def test_hdf5_group_where_a_dataset_belongs(tmp_path):
    f = _h5(tmp_path / "b.h5", data="group", label=np.zeros(2, np.float32))
    with pytest.raises(LayerError, match=r"HDF5 file '.*b.h5' has no dataset 'data' for top 'data'"):
        _hdf5_layer(tmp_path, f).SetUp([], [Blob(), Blob()])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_list_and_mean_files_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(LayerError, match="it is a FIFO"):
        make_layer("HDF5Data", f'top: "data" hdf5_data_param {{ source: "{fifo}" batch_size: 2 }}').SetUp(
            [], [Blob()])
    with pytest.raises(DataError, match=r"mean_file '.*pipe': it is a FIFO"):
        load_mean_file(str(fifo))
    with pytest.raises(DataError, match=r"'/dev/zero': it is a character device"):
        load_mean_file("/dev/zero")
