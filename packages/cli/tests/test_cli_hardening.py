"""caffe-cli under hostile input and faults, as a user types it: /dev/zero and FIFOs for --model/--weights/
--solver, a truncated LMDB (SIGBUS before), binary files given to the text upgraders, output modes that follow
the umask, two trainings on one snapshot_prefix, and converters killed with SIGKILL."""
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from caffe.cli.main import main
from caffe.layers import db
from caffe.layers.data_transformer import array_to_datum

NET = """name: "tiny"
layer {{ name: "data" type: "Data" top: "data" top: "label"
        data_param {{ source: "{source}" batch_size: 8 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

SOLVER = """net: "{net}"
base_lr: 0.01
lr_policy: "fixed"
max_iter: {max_iter}
display: 0
snapshot_prefix: "{prefix}"
solver_mode: CPU
"""


def cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "caffe.cli.main", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def tiny(tmp_path):
    """A 200-record LMDB of 1x8x8 images, a net reading it, its weights, a solver."""
    rng = np.random.default_rng(0)
    source = tmp_path / "train_lmdb"
    db.write_db(str(source), ((f"{i:08d}", array_to_datum(rng.integers(0, 256, (1, 8, 8), dtype=np.uint8),
                                                           i % 10).SerializeToString()) for i in range(200)))
    net = tmp_path / "net.prototxt"
    net.write_text(NET.format(source=source))
    import caffe
    weights = tmp_path / "w.caffemodel"
    caffe.Net(str(net), caffe.TEST).Save(str(weights))
    solver = tmp_path / "solver.prototxt"
    solver.write_text(SOLVER.format(net=net, max_iter=2, prefix=tmp_path / "snap"))
    return tmp_path


# -- endless streams, FIFOs --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["test", "--model=/dev/zero", "--weights={w}"], "--model"),
    (["test", "--model={net}", "--weights=/dev/zero"], "--weights"),
    (["train", "--solver=/dev/zero"], "--solver"),
    (["train", "--solver={solver}", "--snapshot=/dev/zero"], "--snapshot"),
])
def test_dev_zero_is_refused_at_once(tiny, argv, flag):
    argv = [a.format(w=tiny / "w.caffemodel", net=tiny / "net.prototxt", solver=tiny / "solver.prototxt")
            for a in argv]
    start = time.monotonic()
    proc = cli(*argv, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"{flag} file '/dev/zero': it is a character device, not a regular file" in proc.stderr
    assert time.monotonic() - start < 120


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_model_does_not_block(tiny):
    fifo = tiny / "fifo.prototxt"
    os.mkfifo(fifo)
    proc = cli("test", f"--model={fifo}", f"--weights={tiny / 'w.caffemodel'}", timeout=120)
    assert proc.returncode == 1 and "it is a FIFO (named pipe), not a regular file" in proc.stderr


# -- truncated LMDB ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["test", "train"])
def test_truncated_lmdb_is_an_error_not_sigbus(tiny, command):
    data = tiny / "train_lmdb" / "data.mdb"
    os.truncate(data, os.path.getsize(data) // 3)
    args = (["test", f"--model={tiny / 'net.prototxt'}", f"--weights={tiny / 'w.caffemodel'}", "--iterations=2"]
            if command == "test" else ["train", f"--solver={tiny / 'solver.prototxt'}"])
    proc = cli(*args)
    assert proc.returncode == 1, f"exit {proc.returncode} (135 is SIGBUS): {proc.stderr[-2000:]}"
    assert f"LMDB database '{tiny / 'train_lmdb'}'" in proc.stderr and "is truncated" in proc.stderr
    assert "Layer 'data' (Data)" in proc.stderr


# -- upgrade tools -------------------------------------------------------------------------------

def test_text_upgraders_on_a_binary_file(tiny, capsys):
    out = tiny / "out.prototxt"
    assert main(["upgrade_net_proto_text", str(tiny / "w.caffemodel"), str(out)]) == 1
    err = capsys.readouterr().err
    assert "failed to parse input text file as NetParameter" in err and "w.caffemodel" in err
    assert "it is not a text file" in err and "upgrade_net_proto_binary" in err and "codec" not in err
    assert main(["upgrade_solver_proto_text", str(tiny / "w.caffemodel"), str(out)]) == 1
    assert "it is not a text file" in capsys.readouterr().err
    assert not out.exists()


# -- output modes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_outputs_get_the_mode_of_any_new_file(tiny, capsys, mask):
    old = os.umask(mask)
    try:
        assert main(["compute_image_mean", str(tiny / "train_lmdb"), str(tiny / "mean.binaryproto")]) == 0
        assert main(["upgrade_net_proto_text", str(tiny / "net.prototxt"), str(tiny / "up.prototxt")]) == 0
        assert main(["upgrade_net_proto_binary", str(tiny / "w.caffemodel"), str(tiny / "up.caffemodel")]) == 0
        assert main(["upgrade_solver_proto_text", str(tiny / "solver.prototxt"), str(tiny / "up_solver.prototxt")]) == 0
    finally:
        os.umask(old)
    for name in ("mean.binaryproto", "up.prototxt", "up.caffemodel", "up_solver.prototxt"):
        assert stat.S_IMODE(os.stat(tiny / name).st_mode) == 0o666 & ~mask, name
    assert not [n for n in os.listdir(tiny) if n.startswith(".")]


# -- one training per snapshot_prefix ---------------------------------------------------------------

def test_second_training_on_one_prefix(tiny):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import threading
        from caffe.solver import snapshot_lock
        snapshot_lock.acquire({str(tiny / 'snap')!r})
        print("MARK", flush=True)
        threading.Event().wait()
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "MARK"
        proc = cli("train", f"--solver={tiny / 'solver.prototxt'}")
        assert proc.returncode == 1
        assert f"snapshot_prefix '{tiny / 'snap'}' is in use by another training (pid {holder.pid}" in proc.stderr
        assert not (tiny / "snap_iter_2.caffemodel").exists()
        proc = cli("train", f"--solver={tiny / 'solver.prototxt'}", "--overwrite_snapshots")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "writing there anyway" in proc.stderr and (tiny / "snap_iter_2.caffemodel").exists()
    finally:
        holder.kill()
        holder.wait()


# -- converters killed with SIGKILL -------------------------------------------------------------------

_KILLED_CONVERTER = """
import sys, threading
from caffe.layers import db
real = db.DBWriter.commit
def commit(self):
    real(self)
    print("MARK", flush=True)  # the partial database holds a batch: die here
    threading.Event().wait()
db.DBWriter.commit = commit
from caffe.cli.main import main
main(sys.argv[1:])
"""


def _kill_converter_and_wait_for_cleanup(tmp_path, argv):
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CONVERTER, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == "MARK", proc.stderr.read()[-2000:] if proc.poll() is not None else line
        partial = [n for n in os.listdir(tmp_path) if ".partial-" in n]
        assert len(partial) == 1 and partial[0].startswith(".out_db.partial-")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # the watcher learns of the death at once (its pipe closes); wait for it, bounded
    end = time.monotonic() + 60
    while [n for n in os.listdir(tmp_path) if ".partial-" in n] and time.monotonic() < end:
        time.sleep(0.05)
    assert not [n for n in os.listdir(tmp_path) if ".partial-" in n or n == "out_db"]


def test_killed_convert_mnist_data_leaves_nothing(tmp_path):
    import pathlib
    mnist = pathlib.Path(__file__).resolve().parents[3] / "data" / "mnist"
    _kill_converter_and_wait_for_cleanup(tmp_path, ["convert_mnist_data", mnist / "t10k-images-idx3-ubyte.gz",
                                                    mnist / "t10k-labels-idx1-ubyte.gz", tmp_path / "out_db"])


def test_killed_convert_imageset_leaves_nothing(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    root = tmp_path / "imgs"
    root.mkdir()
    lines = []
    for i in range(1001):  # one more than a commit batch
        if i < 3:
            Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(root / f"p{i}.png")
        lines.append(f"p{i % 3}.png {i % 10}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    _kill_converter_and_wait_for_cleanup(tmp_path, ["convert_imageset", f"{root}/", tmp_path / "list.txt",
                                                    tmp_path / "out_db"])
