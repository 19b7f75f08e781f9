"""caffe-cli train/test/time/device_query end to end on the bundled digits, and their bad inputs.

One module-scoped LMDB pair is converted from data/mnist with convert_mnist_data; training runs in
subprocesses exactly as a user types it.
"""
import os
import pathlib
import re
import shutil
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


def write_solver(workdir, name, max_iter, snapshot=0, test_interval=100, extra="", test_iter=10):
    path = workdir / "examples" / "mnist" / f"{name}.prototxt"
    path.write_text(f"""
net: "examples/mnist/lenet_train_test.prototxt"
test_iter: {test_iter}
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


def caffe_command():
    """The `caffe` console script installed beside this interpreter (pip install caffe-cli)."""
    exe = pathlib.Path(sys.executable).parent / "caffe"
    if not exe.exists():
        pytest.skip(f"the caffe console script is not installed beside {sys.executable}")
    return str(exe)


def test_final_test_net_only_from_a_test_at_the_last_iteration(workdir, tmp_path):
    # Caffe tests at the end when max_iter is a multiple of test_interval; here it is not: the only test
    # ran at iteration 0, and its figures would describe other weights than the saved ones
    stale = write_solver(workdir, "lenet_stale", max_iter=10, test_interval=500, test_iter=2)
    out = cli("train", f"--solver={stale}", cwd=workdir, check=True)
    assert "Iteration 0, Testing net (#0)" in out.stderr and "Final test net" not in out.stderr
    assert "Final snapshot: examples/mnist/lenet_stale_iter_10.caffemodel" in out.stderr
    # the same program as `caffe`, as users' scripts call it; its glog files are named for it
    fresh = write_solver(workdir, "lenet_fresh", max_iter=10, test_interval=5, test_iter=2)
    proc = subprocess.run([caffe_command(), "train", "-solver", str(fresh), f"-log_dir={tmp_path}"], cwd=workdir,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = re.findall(r"Test net output #0: accuracy = ([\d.]+)", proc.stderr)[-1]
    assert re.search(rf"Final test net #0: accuracy = {re.escape(last)}\n", proc.stderr)
    assert "Iteration 10, Testing net (#0)" in proc.stderr
    logs = [p.name for p in tmp_path.iterdir() if ".log.INFO." in p.name]
    assert len(logs) == 1 and logs[0].startswith("caffe.") and (tmp_path / "caffe.INFO").is_symlink()
    assert "Final test net #0" in (tmp_path / logs[0]).read_text()


def test_caffe_command_usage():
    proc = subprocess.run([caffe_command()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("usage: caffe <command>")
    proc = subprocess.run([caffe_command(), "nope"], capture_output=True, text=True, timeout=120)
    assert "caffe: unknown command 'nope'" in proc.stderr


def test_solver_mode_gpu_picks_device_id_or_gpu_0(monkeypatch, caplog):
    from caffe.blob import context
    from caffe.cli.caffe_tool import training_gpus
    from caffe.cli.main import CliError
    from caffe.proto import caffe_pb2
    gpu = caffe_pb2.SolverParameter(solver_mode=caffe_pb2.SolverParameter.GPU)
    cpu = caffe_pb2.SolverParameter(solver_mode=caffe_pb2.SolverParameter.CPU)
    monkeypatch.setattr(context, "gpu_available", lambda: True)
    monkeypatch.setattr(context, "gpu_count", lambda: 2)
    assert training_gpus(gpu, "") == [0]  # no device_id: GPU 0, as Caffe
    assert training_gpus(caffe_pb2.SolverParameter(solver_mode=gpu.GPU, device_id=1), "") == [1]
    assert training_gpus(cpu, "") == [] and training_gpus(gpu, "1") == [1]  # --gpu decides when given
    with pytest.raises(CliError, match="s.prototxt: solver_mode GPU, device_id 5: .*GPU 5 does not exist"):
        training_gpus(caffe_pb2.SolverParameter(solver_mode=gpu.GPU, device_id=5), "", "s.prototxt")
    monkeypatch.setattr(context, "gpu_available", lambda: False)
    with caplog.at_level("WARNING", logger="caffe"):
        assert training_gpus(gpu, "") == []
    assert "solver_mode: GPU (device 0) but there is no usable GPU" in caplog.text


def test_progress_bar_keeps_log_lines_whole(monkeypatch):
    import io
    import logging
    from caffe.cli.glog import setup_logging
    from caffe.cli.progress import Progress
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        setup_logging()  # the tools' console handler, on sys.stderr

        class Solver:
            iter = 3
            callbacks = []

            def add_callback(self, on_start, on_gradients_ready):
                self.callbacks.append(on_gradients_ready)

        solver = Solver()
        bar = Progress.attach(solver, total=10, force=True)
        for i in range(4):
            solver.callbacks[0]()
            logging.getLogger("caffe.solver").info("Iteration %d, loss = 0.5", 4 + i)
        bar.close()
        logging.getLogger("caffe.solver").info("after the bar")
    finally:
        root.handlers[:], root.level = saved
    segments = [s for s in re.split(r"[\r\n]", stream.getvalue()) if s.strip()]
    lines = [s for s in segments if "] " in s]
    assert [s.split("] ", 1)[1] for s in lines] == [f"Iteration {i}, loss = 0.5" for i in range(4, 8)] + \
        ["after the bar"]
    assert all(re.fullmatch(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] .*", s) for s in lines)  # whole lines
    assert any("7/10" in s for s in segments)  # the bar counted from the solver's iteration 3
    assert bar.done == 7


def test_draw_labels_and_images(tmp_path):
    pytest.importorskip("pydot", reason="pydot (caffe-cli's 'draw' extra) is not installed")
    out = cli("draw", EXAMPLE_NET, tmp_path / "net.dot", "--phase=TEST", "--display_lrm", check=True)
    dot = (tmp_path / "net.dot").read_text()
    assert r'"conv1\n(Convolution)\nkernel size: 5\nstride: 1\npad: 0\nlr mult: 1.0, 2.0"' in dot
    assert "\\\\n" not in dot and "Batch 100" in dot and "Batch 64" not in dot  # the TEST data layer only
    cli("draw", EXAMPLE_NET, tmp_path / "tb.dot", "-rankdir", "TB", check=True)
    assert '"conv1 (Convolution) kernel size: 5 stride: 1 pad: 0"' in (tmp_path / "tb.dot").read_text()
    bad = cli("draw", EXAMPLE_NET, tmp_path / "x.dot", "--phase=VAL")
    assert bad.returncode == 1 and "--phase=VAL" in bad.stderr
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot program is not installed: PNG drawing not exercised")
    cli("draw", EXAMPLE_NET, tmp_path / "net.png", check=True)
    assert (tmp_path / "net.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
