"""convert_imageset (round trips: raw, gray, resized, encoded, shuffled, LevelDB) and compute_image_mean."""
import io
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from caffe.blob import Blob, context
from caffe.cli.main import main
from caffe.layers import db
from caffe.layers.data_transformer import DataTransformer, load_mean_file
from caffe.layers.testing import make_layer
from caffe.proto import caffe_pb2

Image = pytest.importorskip("PIL.Image")


@pytest.fixture
def imageset(tmp_path):
    """6 RGB PNGs (one of them gray) of 6x8, a list file with labels."""
    rng = np.random.default_rng(0)
    root = tmp_path / "imgs"
    root.mkdir()
    arrs, lines = [], []
    for i in range(6):
        a = rng.integers(0, 256, size=(6, 8, 3)).astype(np.uint8)
        if i == 5:
            Image.fromarray(a[:, :, 0]).save(root / f"p{i}.png")
            a = np.repeat(a[:, :, :1], 3, axis=2)
        else:
            Image.fromarray(a).save(root / f"p{i}.png")
        arrs.append(a)
        lines.append(f"p{i}.png {i + 1}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return tmp_path, arrs


def read_back(path, backend="lmdb"):
    with db.open_db(str(path), backend) as d:
        return [(k.decode(), caffe_pb2.Datum.FromString(v)) for k, v in d.items()]


def convert(tmp_path, *flags, name="out_db"):
    return main(["convert_imageset", *flags, f"{tmp_path}/imgs/", str(tmp_path / "list.txt"), str(tmp_path / name)])


def test_raw_color_round_trip(imageset):
    tmp_path, arrs = imageset
    assert convert(tmp_path) == 0
    recs = read_back(tmp_path / "out_db")
    assert [k for k, _ in recs] == [f"{i:08d}_p{i}.png" for i in range(6)]
    for i, (_, d) in enumerate(recs):
        assert (d.channels, d.height, d.width, d.encoded, d.label) == (3, 6, 8, False, i + 1)
        np.testing.assert_array_equal(np.frombuffer(d.data, np.uint8).reshape(3, 6, 8),
                                      arrs[i][:, :, ::-1].transpose(2, 0, 1))  # BGR, channel-first


def test_gray_resize_and_check_size(imageset):
    tmp_path, arrs = imageset
    assert convert(tmp_path, "-gray", "-resize_width=5", "--resize_height", "4", "-check_size") == 0
    for i, (_, d) in enumerate(read_back(tmp_path / "out_db")):
        assert (d.channels, d.height, d.width) == (1, 4, 5)
        want = np.asarray(Image.fromarray(arrs[i]).convert("L").resize((5, 4), Image.BILINEAR))
        np.testing.assert_array_equal(np.frombuffer(d.data, np.uint8).reshape(4, 5), want)


def test_encoded_keeps_the_file_or_reencodes(imageset):
    tmp_path, arrs = imageset
    assert convert(tmp_path, "-encoded") == 0
    recs = read_back(tmp_path / "out_db")
    for i, (_, d) in enumerate(recs[:5]):
        assert d.encoded and d.data == (tmp_path / "imgs" / f"p{i}.png").read_bytes()  # the file itself
    # the gray PNG, asked for in color, is decoded and re-encoded as a color PNG
    d5 = recs[5][1]
    assert d5.encoded and Image.open(io.BytesIO(d5.data)).mode == "RGB"
    # read by the Data layer, encoded records equal the raw conversion
    assert convert(tmp_path, name="raw_db") == 0
    tops = []
    for name in ("out_db", "raw_db"):
        layer = make_layer("Data", f'data_param {{ source: "{tmp_path / name}" batch_size: 6 backend: LMDB }}')
        top = [Blob(), Blob()]
        layer.SetUp([], top)
        layer.Forward([], top)
        tops.append(top[0].data.copy())
        layer.close()
    np.testing.assert_array_equal(tops[0], tops[1])


def test_encode_type_jpg_with_resize(imageset):
    tmp_path, _ = imageset
    assert convert(tmp_path, "-encode_type=jpg", "-resize_height=12", "-resize_width=16") == 0
    for _, d in read_back(tmp_path / "out_db"):
        im = Image.open(io.BytesIO(d.data))
        assert d.encoded and im.format == "JPEG" and im.size == (16, 12)


def test_shuffle_keeps_pairs(imageset):
    tmp_path, arrs = imageset
    context.set_random_seed(4)
    assert convert(tmp_path, "-shuffle") == 0
    recs = read_back(tmp_path / "out_db")
    assert sorted(d.label for _, d in recs) == [1, 2, 3, 4, 5, 6]
    for k, d in recs:
        i = int(k.split("_p")[1].split(".")[0])
        assert d.label == i + 1
        np.testing.assert_array_equal(np.frombuffer(d.data, np.uint8).reshape(3, 6, 8),
                                      arrs[i][:, :, ::-1].transpose(2, 0, 1))


def test_leveldb_backend(imageset):
    pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    tmp_path, arrs = imageset
    assert convert(tmp_path, "-backend", "leveldb") == 0
    assert len(read_back(tmp_path / "out_db", "leveldb")) == 6


def test_bad_entries_leave_no_database(imageset, capsys):
    tmp_path, _ = imageset
    (tmp_path / "list.txt").write_text("p0.png 0\np9.png 1\n")
    assert convert(tmp_path) == 1
    err = capsys.readouterr().err
    assert "image '" in err and "p9.png' (LISTFILE '" in err and "line 2): no such file" in err
    (tmp_path / "imgs" / "bad.png").write_bytes(b"\x89PNG broken")
    (tmp_path / "list.txt").write_text("p0.png 0\nbad.png 1\n")
    assert convert(tmp_path) == 1
    assert "bad.png' (LISTFILE" in capsys.readouterr().err
    (tmp_path / "list.txt").write_text("p0.png zero\n")
    assert convert(tmp_path) == 1
    assert "line 1: expected 'path label'" in capsys.readouterr().err
    assert not [n for n in os.listdir(tmp_path) if "out_db" in n]


def test_check_size_rejects_a_different_size(imageset, capsys):
    tmp_path, _ = imageset
    Image.fromarray(np.zeros((7, 8, 3), np.uint8)).save(tmp_path / "imgs" / "tall.png")
    (tmp_path / "list.txt").write_text("p0.png 0\ntall.png 1\n")
    assert convert(tmp_path, "-check_size") == 1
    assert "tall.png' (LISTFILE" in (err := capsys.readouterr().err) and "incorrect data field size 168" in err
    assert convert(tmp_path) == 0  # without -check_size Caffe stores it


def test_compute_image_mean(imageset, capsys):
    tmp_path, arrs = imageset
    assert convert(tmp_path) == 0
    mean_file = tmp_path / "mean.binaryproto"
    assert main(["compute_image_mean", "-backend=lmdb", str(tmp_path / "out_db"), str(mean_file)]) == 0
    want = np.mean([a[:, :, ::-1].transpose(2, 0, 1) for a in arrs], axis=0, dtype=np.float64)
    mean = load_mean_file(str(mean_file))
    np.testing.assert_allclose(mean, want.astype(np.float32), rtol=1e-6)
    proto = caffe_pb2.BlobProto.FromString(mean_file.read_bytes())
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 3, 6, 8)  # Caffe's legacy dims
    err = capsys.readouterr().err
    assert "Number of channels: 3" in err and "mean_value channel [2]:" in err
    # the mean file plugs into transform_param.mean_file
    tf = DataTransformer(caffe_pb2.TransformationParameter(mean_file=str(mean_file)), 1)
    x = arrs[0][:, :, ::-1].transpose(2, 0, 1)
    np.testing.assert_array_equal(tf.transform(x), x.astype(np.float32) - mean)


def test_compute_image_mean_errors(tmp_path, capsys):
    src = str(tmp_path / "db")
    a = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"\0" * 4)
    b = caffe_pb2.Datum(channels=1, height=2, width=3, data=b"\0" * 6)
    db.write_db(src, [("a", a.SerializeToString()), ("b", b.SerializeToString())])
    assert main(["compute_image_mean", src]) == 1
    assert "record 'b' of LMDB" in (err := capsys.readouterr().err) and "incorrect data field size 6" in err
    assert main(["compute_image_mean", str(tmp_path / "none")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_killed_conversion_leaves_no_database(tmp_path):
    """SIGTERM a real caffe-cli convert_imageset mid-way: neither the target nor its partial folder remains."""
    root = tmp_path / "imgs"
    root.mkdir()
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(root / "a.png")
    (tmp_path / "list.txt").write_text("a.png 0\n" * 100000)  # one image, many entries: a long conversion
    target = tmp_path / "big_db"
    proc = subprocess.Popen([sys.executable, "-m", "caffe.cli.main", "convert_imageset", f"{root}/",
                             str(tmp_path / "list.txt"), str(target)], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # wait until a transaction has been committed
            if "Processed 1000 files." in line:
                break
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0
    assert sorted(os.listdir(tmp_path)) == ["imgs", "list.txt"]
