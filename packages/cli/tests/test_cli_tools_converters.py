"""convert_cifar_data and convert_mnist_siamese_data: round trips from generated files of CIFAR-10's binary
format and MNIST's IDX format into LMDB and LevelDB, read back as Caffe's Data layer reads them, and their
bad inputs."""
import gzip
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from caffe.cli.main import main
from caffe.layers import db
from caffe.proto import caffe_pb2

BACKENDS = ["lmdb", pytest.param("leveldb", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("plyvel") is None, reason="LevelDB needs the optional plyvel package"))]


def records(path, backend):
    with db.open_db(str(path), backend) as d:
        return [(k, caffe_pb2.Datum.FromString(v)) for k, v in d.items()]


def write_cifar(folder, sizes, seed=0):
    """CIFAR-10 binary batches: per record a label byte and 3x32x32 image bytes (R, G, B planes)."""
    rng = np.random.default_rng(seed)
    batches = []
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for name, n in zip(names, sizes):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        (folder / name).write_bytes(np.concatenate([labels[:, None], images], axis=1).tobytes())
        batches.append((labels, images))
    return batches


@settings(deadline=None, max_examples=5)
@given(st.lists(st.integers(1, 4), min_size=6, max_size=6), st.sampled_from(["lmdb"]))
def test_cifar_round_trip(tmp_path_factory, sizes, backend):
    _cifar_round_trip(tmp_path_factory.mktemp("cifar"), sizes, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cifar_backends(tmp_path, backend):
    _cifar_round_trip(tmp_path, [2, 1, 3, 1, 2, 3], backend)


def _cifar_round_trip(tmp, sizes, backend):
    src = tmp / "cifar-10-batches-bin"
    src.mkdir()
    batches = write_cifar(src, sizes)
    assert main(["convert_cifar_data", str(src), str(tmp), backend]) == 0
    train = records(tmp / f"cifar10_train_{backend}", backend)
    test = records(tmp / f"cifar10_test_{backend}", backend)
    expected_train = [(int(l), im) for labels, images in batches[:5] for l, im in zip(labels, images)]
    expected_test = [(int(l), im) for l, im in zip(*batches[5])]
    for got, expected in ((train, expected_train), (test, expected_test)):
        assert [k for k, _ in got] == [b"%05d" % i for i in range(len(expected))]
        for (_, datum), (label, image) in zip(got, expected):
            assert (datum.channels, datum.height, datum.width, datum.label) == (3, 32, 32, label)
            assert datum.data == image.tobytes()  # channel planes as stored: Caffe's C x H x W
    assert not [n for n in os.listdir(tmp) if n.startswith(".")]


def test_cifar_bad_inputs(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    assert main(["convert_cifar_data", str(tmp_path / "none"), str(tmp_path)]) == 1
    assert "input folder" in capsys.readouterr().err
    write_cifar(src, [1, 1, 1, 1, 1, 1])
    (src / "data_batch_3.bin").write_bytes(b"\x00" * 3074)  # a record and one stray byte
    assert main(["convert_cifar_data", str(src), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "data_batch_3.bin" in err and "3073-byte records" in err
    assert not (tmp_path / "cifar10_train_lmdb").exists()  # nothing written when an input is bad
    (src / "test_batch.bin").unlink()
    write_cifar(src, [1, 1, 1, 1, 1])
    assert main(["convert_cifar_data", str(src), str(tmp_path)]) == 1
    assert "test_batch.bin" in capsys.readouterr().err
    assert main(["convert_cifar_data", str(src), str(tmp_path), "hdf5"]) == 1
    assert "expected lmdb or leveldb" in capsys.readouterr().err


def write_idx(folder, labels, rows=3, cols=4, gz=False):
    """IDX files whose image k holds k's bytes, so each pair can be traced back to its two images."""
    n = len(labels)
    images = (np.arange(n, dtype=np.uint32)[:, None] * 7 + np.arange(rows * cols)) % 251
    img = np.array([2051, n, rows, cols], ">u4").tobytes() + images.astype(np.uint8).tobytes()
    lab = np.array([2049, n], ">u4").tobytes() + np.asarray(labels, np.uint8).tobytes()
    opener = gzip.compress if gz else (lambda b: b)
    (folder / "img").write_bytes(opener(img))
    (folder / "lab").write_bytes(opener(lab))
    return images.astype(np.uint8).reshape(n, rows, cols)


@pytest.mark.parametrize("backend", BACKENDS)
def test_siamese_pairs_round_trip(tmp_path, backend):
    labels = [0, 1, 0, 2, 1, 0, 2, 2, 1, 0, 1, 2]
    images = write_idx(tmp_path, labels, gz=backend == "lmdb")
    out = tmp_path / "pairs"
    assert main(["convert_mnist_siamese_data", f"--backend={backend}", "--seed=3", str(tmp_path / "img"),
                 str(tmp_path / "lab"), str(out)]) == 0
    recs = records(out, backend)
    assert [k for k, _ in recs] == [b"%08d" % i for i in range(len(labels))]
    flat = {im.tobytes(): k for k, im in enumerate(images)}
    drawn = []
    for _, datum in recs:
        assert (datum.channels, datum.height, datum.width) == (2, 3, 4)  # the pair: one image per channel
        i, j = flat[datum.data[:12]], flat[datum.data[12:]]
        assert datum.label == int(labels[i] == labels[j])
        drawn.append((i, j))
    again = tmp_path / "again"
    main(["convert_mnist_siamese_data", f"--backend={backend}", "--seed=3", str(tmp_path / "img"),
          str(tmp_path / "lab"), str(again)])
    assert [d.data for _, d in records(again, backend)] == [d.data for _, d in recs]  # the seed fixes the draw
    assert len(set(drawn)) > 1


def test_siamese_default_is_leveldb_and_bad_inputs(tmp_path, capsys, monkeypatch):
    write_idx(tmp_path, [0, 1, 1])
    (tmp_path / "lab3").write_bytes(np.array([2049, 2], ">u4").tobytes() + bytes([0, 1]))
    assert main(["convert_mnist_siamese_data", str(tmp_path / "img"), str(tmp_path / "lab3"),
                 str(tmp_path / "x")]) == 1
    assert "3 images but" in capsys.readouterr().err
    assert main(["convert_mnist_siamese_data", str(tmp_path / "img"), str(tmp_path / "lab")]) == 1
    assert "expected 3 arguments" in capsys.readouterr().err
    import builtins
    real_import = builtins.__import__

    def no_plyvel(name, *args, **kwargs):
        if name == "plyvel":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plyvel)
    assert main(["convert_mnist_siamese_data", str(tmp_path / "img"), str(tmp_path / "lab"),
                 str(tmp_path / "y")]) == 1  # Caffe's default backend, LevelDB
    assert "plyvel" in capsys.readouterr().err and not (tmp_path / "y").exists()
