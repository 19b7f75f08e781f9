"""Snapshots under faults and misuse: two trainings on one snapshot_prefix, kill -9 in the middle of a snapshot,
a full disk, the single temporary file of an HDF5 snapshot, and solver states no solver writes."""
import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

from caffe.blob import context  # noqa: E402
from caffe.blob.fileio import WriteError  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import Solver, SolverError, snapshot_lock  # noqa: E402
from caffe.solver.testing import least_squares_net, solver_param  # noqa: E402

HDF5 = caffe_pb2.SolverParameter.HDF5


def make(prefix, max_iter=2, fmt=caffe_pb2.SolverParameter.BINARYPROTO, **extra):
    context.set_random_seed(1)
    fields = dict(type="SGD", base_lr=0.01, lr_policy="fixed", display=0, max_iter=max_iter,
                  snapshot_prefix=str(prefix), snapshot_format=fmt, snapshot_after_train=True, random_seed=1)
    fields.update(extra)
    return Solver(solver_param(least_squares_net(4, 3), **fields))


def spawn(code: str):
    """A child process that prints MARK when it reached the point to be interrupted, then waits."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "MARK":
        proc.kill()
        raise AssertionError(f"child did not reach its mark: {line!r} {proc.communicate()[1][-3000:]}")
    return proc


def kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def hidden(d):
    return sorted(n for n in os.listdir(d) if n.startswith("."))


# -- one training per snapshot_prefix ------------------------------------------------------------------

def test_second_training_on_a_prefix_is_refused_while_the_first_runs(tmp_path):
    prefix = tmp_path / "lenet"
    other = spawn(f"""
        import threading
        from caffe.solver import snapshot_lock
        snapshot_lock.acquire({str(prefix)!r})
        print("MARK", flush=True)
        threading.Event().wait()
        """)
    try:
        solver = make(prefix)
        with pytest.raises(SolverError) as info:
            solver.Solve()
        msg = str(info.value)
        assert f"snapshot_prefix '{prefix}' is in use by another training (pid {other.pid} on " in msg
        assert "--overwrite_snapshots" in msg and solver.iter == 0
        assert not (tmp_path / "lenet_iter_2.caffemodel").exists()
        # asked to overwrite: it trains and snapshots there anyway
        solver.overwrite_snapshots = True
        solver.Solve()
        assert (tmp_path / "lenet_iter_2.caffemodel").exists()
    finally:
        kill(other)
    # the holder is gone (killed): its lock went with it, and the next training takes the prefix
    make(prefix, max_iter=3).Solve()
    assert (tmp_path / "lenet_iter_3.solverstate").exists()
    assert hidden(tmp_path) == []  # the lock file is removed when the training ends


def test_solvers_of_one_process_share_the_prefix(tmp_path):
    a, b = make(tmp_path / "p"), make(tmp_path / "p")
    a.step(1)
    a.Snapshot()  # a step()-driven solver holds the prefix from its first snapshot
    b.Solve()
    a.Snapshot()
    assert os.path.exists(snapshot_lock.lock_path(str(tmp_path / "p")))
    a.release_snapshot_prefix()
    assert not os.path.exists(snapshot_lock.lock_path(str(tmp_path / "p")))


# -- kill -9 in the middle of a snapshot -----------------------------------------------------------

@pytest.mark.parametrize("fmt", ["binary", "hdf5"])
def test_kill_mid_snapshot_leaves_the_old_files_and_the_next_run_cleans_up(tmp_path, fmt):
    prefix = tmp_path / "net"
    ext = ".caffemodel" if fmt == "binary" else ".caffemodel.h5"
    proc = spawn(f"""
        import threading
        from caffe.proto import caffe_pb2
        from caffe.blob import context
        from caffe.solver import Solver
        from caffe.solver.testing import least_squares_net, solver_param
        import caffe.net.weights as weights
        context.set_random_seed(1)
        fmt = caffe_pb2.SolverParameter.{"BINARYPROTO" if fmt == "binary" else "HDF5"}
        s = Solver(solver_param(least_squares_net(4, 3), type="SGD", base_lr=0.01, lr_policy="fixed", display=0,
                                max_iter=10, snapshot_prefix={str(prefix)!r}, snapshot_format=fmt))
        s.step(1)
        s.Snapshot()                                   # a complete snapshot at iteration 1
        s.step(1)
        def stop_here(*args, **kwargs):                # then die in the middle of the next one
            print("MARK", flush=True)
            threading.Event().wait()
        weights._write_layer = stop_here
        real = weights.WeightsMixin.ToHDF5
        import h5py
        class F(h5py.File):
            def create_group(self, *a, **k):
                stop_here()
        h5py.File = F
        s.Snapshot()
        """)
    try:
        temps = hidden(tmp_path)
        assert any(t.startswith(f".net_iter_2{ext}.tmp-{proc.pid}-") for t in temps), temps
    finally:
        kill(proc)
    names = sorted(os.listdir(tmp_path))
    assert f"net_iter_1{ext}" in names and f"net_iter_2{ext}" not in names  # nothing half-written by name
    state_1 = f"net_iter_1.solverstate{'.h5' if fmt == 'hdf5' else ''}"
    # the next training on the prefix resumes from the last complete snapshot and removes the debris
    solver = make(prefix, max_iter=3, fmt=HDF5 if fmt == "hdf5" else caffe_pb2.SolverParameter.BINARYPROTO)
    solver.Solve(str(tmp_path / state_1))
    assert hidden(tmp_path) == [] and solver.iter == 3
    assert f"net_iter_3{ext}" in os.listdir(tmp_path)


# -- full disk -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_full_disk_during_a_snapshot_names_the_file(tmp_path, fmt):
    prefix = tmp_path / "full"
    code = f"""
        import resource, signal
        from caffe.proto import caffe_pb2
        from caffe.blob import context
        from caffe.blob.fileio import WriteError
        from caffe.solver import Solver
        from caffe.solver.testing import least_squares_net, solver_param
        s = Solver(solver_param(least_squares_net(4, 300), type="SGD", base_lr=0.01, lr_policy="fixed",
                                display=0, max_iter=10, snapshot_prefix={str(prefix)!r},
                                snapshot_format=caffe_pb2.SolverParameter.{fmt}))
        s.step(1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # writes past 1000 bytes fail (EFBIG)
        try:
            s.Snapshot()
        except WriteError as exc:
            print("ERR", exc.errno, exc)
        """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    ext = ".caffemodel" if fmt == "BINARYPROTO" else ".caffemodel.h5"
    assert f"ERR {errno.EFBIG} Cannot write " in proc.stdout and f"'{prefix}_iter_1{ext}'" in proc.stdout, \
        proc.stdout + proc.stderr[-3000:]
    assert os.listdir(tmp_path) == []  # no temporary, no half file


def test_enospc_is_kept_and_explained(tmp_path, monkeypatch):
    import caffe.net.weights as weights
    solver = make(tmp_path / "d")
    solver.step(1)

    def full(f, layer, write_diff):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(weights, "_write_layer", full)
    with pytest.raises(OSError) as info:
        solver.Snapshot()
    assert isinstance(info.value, WriteError) and info.value.errno == errno.ENOSPC
    assert str(info.value) == (f"Cannot write caffemodel '{tmp_path / 'd'}_iter_1.caffemodel': No space left on "
                               f"device (the disk is full); nothing was written under that name")
    assert os.listdir(tmp_path) == [".d.lock"]  # held by this step()-driven solver until released
    solver.release_snapshot_prefix()
    assert os.listdir(tmp_path) == []


def test_hdf5_snapshot_writes_one_temporary_file(tmp_path, monkeypatch):
    import h5py
    opened = []
    real = h5py.File

    def spy(name, mode="r", *a, **k):
        if mode == "w":
            opened.append(os.path.basename(str(name)))
        return real(name, mode, *a, **k)
    monkeypatch.setattr(h5py, "File", spy)
    solver = make(tmp_path / "h", fmt=HDF5)
    solver.step(1)
    solver.Snapshot()
    assert len(opened) == 2, opened  # the model and the state: one temporary file each, beside the target
    assert opened[0].startswith(".h_iter_1.caffemodel.h5.tmp-")
    assert opened[1].startswith(".h_iter_1.solverstate.h5.tmp-")
    solver.release_snapshot_prefix()
    assert sorted(os.listdir(tmp_path)) == ["h_iter_1.caffemodel.h5", "h_iter_1.solverstate.h5"]


# -- what no solver writes ---------------------------------------------------------------------------

def test_negative_max_iter_is_refused(tmp_path):
    with pytest.raises(SolverError, match="max_iter is -5; it must be >= 0"):
        make(tmp_path / "n", max_iter=-5)


def _state(tmp_path, solver, **fields):
    state = caffe_pb2.SolverState()
    solver.step(1)
    solver.Snapshot()
    state.ParseFromString((tmp_path / "s_iter_1.solverstate").read_bytes())
    for name, value in fields.items():
        if value is None:
            state.ClearField(name)
        else:
            setattr(state, name, value)
    path = tmp_path / "edited.solverstate"
    path.write_bytes(state.SerializeToString())
    return str(path)


def test_state_with_a_negative_iteration_is_refused(tmp_path):
    path = _state(tmp_path, make(tmp_path / "s"), iter=-7)
    with pytest.raises(SolverError, match=r"edited.solverstate' gives iteration -7; an iteration is never negative"):
        make(tmp_path / "s").Restore(path)


def test_state_with_an_empty_learned_net_is_refused(tmp_path):
    path = _state(tmp_path, make(tmp_path / "s"), learned_net="")
    with pytest.raises(SolverError, match="has an empty learned_net"):
        make(tmp_path / "s").Restore(path)


def test_state_without_learned_net_warns_and_restores_the_history(tmp_path, caplog):
    path = _state(tmp_path, make(tmp_path / "s"), learned_net=None)
    solver = make(tmp_path / "s")
    with caplog.at_level(logging.WARNING, logger="caffe.solver"):
        solver.Restore(path)
    assert solver.iter == 1
    assert any("names no learned_net: only the solver's history is restored" in r.getMessage()
               for r in caplog.records)


def test_hdf5_state_with_a_group_where_a_dataset_belongs(tmp_path):
    import h5py
    solver = make(tmp_path / "g", fmt=HDF5)
    solver.step(1)
    solver.Snapshot()
    path = tmp_path / "g_iter_1.solverstate.h5"
    with h5py.File(path, "a") as f:
        del f["iter"]
        f.create_group("iter")
    with pytest.raises(SolverError, match=r"'iter' is a group, where a solver writes a dataset"):
        make(tmp_path / "g", fmt=HDF5).Restore(str(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_state_and_solver_files_must_be_regular_files(tmp_path):
    with pytest.raises(SolverError, match=r"'/dev/zero': it is a character device"):
        make(tmp_path / "z").Restore("/dev/zero")
    from caffe.solver import read_solver_params
    with pytest.raises(SolverError, match=r"'/dev/zero': it is a character device"):
        read_solver_params("/dev/zero")
