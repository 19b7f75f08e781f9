"""caffe-cli train/test/time/device_query end to end on the bundled digits, and their bad inputs.

One module-scoped LMDB pair is converted from data/mnist with convert_mnist_data; training runs in
subprocesses exactly as a user types it.
"""
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MNIST = ROOT / "data" / "mnist"
EXAMPLE_NET = ROOT / "examples" / "mnist" / "lenet_train_test.prototxt"


def cli(*args, cwd=None, timeout=600, check=False):
    proc = subprocess.run([sys.executable, "-m", "caffe.cli.main", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"caffe-cli {args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory laid out like the repo root: examples/mnist/{lmdbs, prototxts}."""
    d = tmp_path_factory.mktemp("lenet")
    ex = d / "examples" / "mnist"
    ex.mkdir(parents=True)
    cli("convert_mnist_data", MNIST / "train-images-idx3-ubyte.gz", MNIST / "train-labels-idx1-ubyte.gz",
        ex / "mnist_train_lmdb", check=True)
    cli("convert_mnist_data", MNIST / "t10k-images-idx3-ubyte.gz", MNIST / "t10k-labels-idx1-ubyte.gz",
        ex / "mnist_test_lmdb", check=True)
    (ex / "lenet_train_test.prototxt").write_text(EXAMPLE_NET.read_text())
    return d


def write_solver(workdir, name, max_iter, snapshot=0, test_interval=100, extra=""):
    path = workdir / "examples" / "mnist" / f"{name}.prototxt"
    path.write_text(f"""
net: "examples/mnist/lenet_train_test.prototxt"
test_iter: 10
test_interval: {test_interval}
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 50
max_iter: {max_iter}
snapshot: {snapshot}
snapshot_prefix: "examples/mnist/{name}"
solver_mode: CPU
random_seed: 1701
{extra}
""")
    return path


def final_accuracy(stderr: str) -> float:
    found = re.findall(r"Test net output #\d+: accuracy = ([\d.]+)", stderr)
    assert found, stderr[-2000:]
    return float(found[-1])


@pytest.fixture(scope="module")
def trained(workdir):
    solver = write_solver(workdir, "lenet_e2e", max_iter=300, test_interval=300)
    proc = cli("train", f"--solver={solver}", cwd=workdir, check=True)
    return workdir, proc


def test_train_reaches_accuracy_and_reports_snapshot(trained):
    workdir, proc = trained
    acc = final_accuracy(proc.stderr)
    assert acc > 0.9, proc.stderr[-2000:]
    assert re.search(r"Final test net #0: accuracy = ", proc.stderr)
    model = workdir / "examples" / "mnist" / "lenet_e2e_iter_300.caffemodel"
    assert model.exists() and (workdir / "examples" / "mnist" / "lenet_e2e_iter_300.solverstate").exists()
    assert f"Final snapshot: examples/mnist/lenet_e2e_iter_300.caffemodel" in proc.stderr
    # glog line format, as Caffe's parse_log expects
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+\.py:\d+\] Iteration 50 \(", proc.stderr, re.M)
    assert re.search(r"Iteration \d+, lr = ", proc.stderr)
    assert proc.returncode == 0


def test_test_command_reproduces_training_accuracy(trained):
    workdir, proc = trained
    acc_train = final_accuracy(proc.stderr)
    out = cli("test", "-model", "examples/mnist/lenet_train_test.prototxt",
              "-weights=examples/mnist/lenet_e2e_iter_300.caffemodel", "--iterations", 10, cwd=workdir, check=True)
    m = re.search(r"\] accuracy = ([\d.]+)", out.stderr)
    assert m, out.stderr[-2000:]
    assert abs(float(m.group(1)) - acc_train) < 1e-6
    assert re.search(r"\] loss = [\d.]+ \(\* 1 = [\d.]+ loss\)", out.stderr)
    assert "Batch 9, accuracy = " in out.stderr


def test_time_prints_every_layer(workdir):
    out = cli("time", "--model=examples/mnist/lenet_train_test.prototxt", "--iterations=2", cwd=workdir,
              check=True)
    for layer in ("mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"):
        assert re.search(rf"\] +{layer}\tforward: [\d.e+-]+ ms\.", out.stderr), layer
        assert re.search(rf"\] +{layer}\tbackward: [\d.e+-]+ ms\.", out.stderr), layer
    for line in ("Average Forward pass", "Average Backward pass", "Average Forward-Backward", "Total Time",
                 "*** Benchmark ends ***"):
        assert line in out.stderr


def test_sigint_snapshots_and_resume_continues(workdir):
    solver = write_solver(workdir, "lenet_sig", max_iter=100000, test_interval=100000)
    proc = subprocess.Popen([sys.executable, "-m", "caffe.cli.main", "train", f"--solver={solver}"],
                            cwd=workdir, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 300
    for line in proc.stderr:  # wait until training runs (iteration 50 displayed)
        lines.append(line)
        if "Iteration 50 (" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    err = "".join(lines) + rest
    assert proc.returncode == 0, err[-2000:]
    snaps = sorted((workdir / "examples" / "mnist").glob("lenet_sig_iter_*.solverstate"))
    assert snaps, err[-2000:]
    it = int(re.search(r"_iter_(\d+)\.solverstate", snaps[-1].name).group(1))
    assert it >= 50
    solver2 = write_solver(workdir, "lenet_sig", max_iter=it + 10, test_interval=100000)
    out = cli("train", f"--solver={solver2}", f"--snapshot={snaps[-1].relative_to(workdir)}", cwd=workdir,
              check=True)
    assert f"Resuming from" in out.stderr
    assert (workdir / "examples" / "mnist" / f"lenet_sig_iter_{it + 10}.caffemodel").exists()


def test_device_query_without_gpu_says_so():
    out = cli("device_query")
    assert out.returncode == 0
    assert "No GPU available" in out.stderr or "Device id" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["train"], "Need a solver definition"),
    (["train", "--solver=s.prototxt", "--snapshot=a", "--weights=b"], "not both"),
    (["train", "--solver=/nonexistent/solver.prototxt"], "/nonexistent/solver.prototxt"),
    (["test", "--model=/nonexistent/net.prototxt", "--weights=x"], "/nonexistent/net.prototxt"),
    (["train", "--solver=s.prototxt", "--gpu=0"], "GPU"),
    (["time", "--bogus=1"], "unknown command line flag 'bogus'"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    (tmp_path / "s.prototxt").write_text('net: "n.prototxt"\n')
    out = cli(*args, cwd=tmp_path)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_prototxt_syntax_error_names_file_line_and_column(tmp_path):
    (tmp_path / "bad.prototxt").write_text('name: "x"\nlayer {\n  name: "a"\n  typo_field: 3\n}\n')
    out = cli("time", "--model=bad.prototxt", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert re.search(r"bad\.prototxt.*4:3", out.stderr), out.stderr


def test_missing_lmdb_is_one_clear_line(tmp_path):
    net = EXAMPLE_NET.read_text()
    (tmp_path / "net.prototxt").write_text(net)
    out = cli("time", "--model=net.prototxt", "--iterations=1", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "mnist_train_lmdb" in out.stderr, out.stderr


def test_debug_flag_shows_traceback(tmp_path):
    (tmp_path / "bad.prototxt").write_text("layer { typo: 1 }\n")
    out = cli("time", "--model=bad.prototxt", "--debug", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_log_dir_writes_glog_file(tmp_path):
    out = cli("device_query", f"--log_dir={tmp_path / 'logs'}")
    assert out.returncode == 0
    files = [p for p in (tmp_path / "logs").iterdir() if ".log.INFO." in p.name]
    assert files and files[0].read_text().strip()
    assert (tmp_path / "logs" / "caffe-cli.INFO").is_symlink()


def test_plot_and_draw(trained, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the 'plot' extra) is not installed")
    workdir, proc = trained
    log = tmp_path / "train.log"
    log.write_text(proc.stderr)
    out = cli("plot", log, tmp_path / "curve.png", check=True)
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = cli("draw", EXAMPLE_NET, tmp_path / "net.dot", check=True)
    dot = (tmp_path / "net.dot").read_text()
    assert "conv1" in dot and "->" in dot


def test_mpiexec_trains_on_two_ranks(workdir):
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec (the mpich wheel of caffe-parallel's 'mpi' extra) is not installed")
    pytest.importorskip("mpi4py", reason="mpi4py (caffe-parallel's 'mpi' extra) is not installed")
    solver = write_solver(workdir, "lenet_mpi", max_iter=20, test_interval=20)
    proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, "-m", "caffe.cli.main", "train",
                           f"--solver={solver}"], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Training on 2 MPI ranks" in proc.stderr
    assert (workdir / "examples" / "mnist" / "lenet_mpi_iter_20.caffemodel").exists()
    assert proc.stderr.count("Snapshotting to binary proto file") == 1  # only rank 0 snapshots
