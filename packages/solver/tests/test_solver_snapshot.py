"""Snapshots and restore: Caffe's file layouts, atomic writes, and bit-exact resumption."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import Solver, SolverError  # noqa: E402
from caffe.solver.state_io import atomic_path  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

NUM, DIM = 4, 3
TYPES = ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"]
FORMATS = {"binary": caffe_pb2.SolverParameter.BINARYPROTO, "hdf5": caffe_pb2.SolverParameter.HDF5}


def needs_layers():
    missing = {"Input", "InnerProduct", "EuclideanLoss"} - set(caffe.layer_type_list())
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


def make(tmp, solver_type, fmt="binary", seed=1, snapshot=0, iter_size=1, policy="multistep", **extra):
    context.set_random_seed(seed)
    fields = dict(type=solver_type, base_lr=0.05 if solver_type != "AdaDelta" else 1.0, lr_policy=policy,
                  gamma=0.5, stepvalue=[2, 4], momentum=0.0 if solver_type in ("AdaGrad", "RMSProp") else 0.9,
                  weight_decay=0.01, iter_size=iter_size, display=0, snapshot=snapshot,
                  snapshot_prefix=str(tmp / "ls"), snapshot_format=FORMATS[fmt], delta=1e-6,
                  snapshot_after_train=False, random_seed=seed)
    fields.update(extra)
    return Solver(solver_param(least_squares_net(NUM, DIM), **fields))


def state_of(solver):
    return ([b.data.copy() for b in solver.net.learnable_params], [h.data.copy() for h in solver.history],
            solver.iter, solver.current_step)


def assert_same_state(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(x, y)
    assert a[2:] == b[2:]


@settings(max_examples=8)
@given(solver_type=st.sampled_from(TYPES), fmt=st.sampled_from(sorted(FORMATS)), k=st.integers(1, 4),
       m=st.integers(1, 3), iter_size=st.integers(1, 2))
def test_snapshot_then_restore_equals_uninterrupted_training(tmp_path_factory, solver_type, fmt, k, m, iter_size):
    needs_layers()
    tmp = tmp_path_factory.mktemp("resume")
    batches = random_batches(3, 7, NUM, DIM)
    straight = make(tmp, solver_type, fmt, iter_size=iter_size)
    Feeder(batches).attach(straight.net)
    straight.step(k + m)

    first = make(tmp, solver_type, fmt, iter_size=iter_size, snapshot=k)
    Feeder(batches).attach(first.net)
    first.step(k)
    ext = ".solverstate.h5" if fmt == "hdf5" else ".solverstate"
    state_file = tmp / f"ls_iter_{k}{ext}"
    assert state_file.exists()

    # a fresh solver with other initial weights: restore must bring back weights, history, iter, step
    resumed = make(tmp, solver_type, fmt, seed=99, iter_size=iter_size)
    Feeder(batches, start=k * iter_size).attach(resumed.net)
    resumed.restore(str(state_file))
    assert resumed.iter == k
    resumed.step(m)
    assert_same_state(state_of(resumed), state_of(straight))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_solve_with_resume_file(tmp_path, fmt):
    needs_layers()
    batches = random_batches(4, 5, NUM, DIM)
    straight = make(tmp_path, "Adam", fmt, max_iter=5)
    Feeder(batches).attach(straight.net)
    straight.solve()
    first = make(tmp_path, "Adam", fmt, max_iter=2, snapshot_after_train=True)
    Feeder(batches).attach(first.net)
    first.solve()
    resumed = make(tmp_path, "Adam", fmt, seed=5, max_iter=5)
    Feeder(batches, start=2).attach(resumed.net)
    resumed.solve(str(tmp_path / ("ls_iter_2.solverstate" + (".h5" if fmt == "hdf5" else ""))))
    assert_same_state(state_of(resumed), state_of(straight))


@pytest.mark.parametrize("solver_type", TYPES)
def test_binary_state_layout_is_caffes(tmp_path, solver_type):
    needs_layers()
    s = make(tmp_path, solver_type, "binary")
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(3)
    s.snapshot()
    model, state_file = tmp_path / "ls_iter_3.caffemodel", tmp_path / "ls_iter_3.solverstate"
    net_param = caffe_pb2.NetParameter()
    net_param.ParseFromString(model.read_bytes())
    ip = [layer for layer in net_param.layer if layer.name == "ip"][0]
    np.testing.assert_array_equal(np.asarray(ip.blobs[0].data, np.float32),
                                  s.net.params["ip"][0].data.ravel())
    state = caffe_pb2.SolverState()
    state.ParseFromString(state_file.read_bytes())
    n = len(s.net.learnable_params)
    assert state.iter == 3
    assert state.learned_net == str(tmp_path / "ls_iter_3.caffemodel")
    assert state.current_step == 1  # multistep, stepvalue [2, 4]: iteration 2 took the first step
    assert len(state.history) == (2 * n if solver_type in ("AdaDelta", "Adam") else n)
    for i, hp in enumerate(state.history):  # the second set (AdaDelta/Adam) follows the first
        param = s.net.learnable_params[i % n]
        assert tuple(hp.shape.dim) == param.shape
        np.testing.assert_array_equal(np.asarray(hp.data, np.float32), s.history[i].data.ravel())
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.parametrize("solver_type", ["SGD", "Adam"])
def test_hdf5_state_layout_is_caffes(tmp_path, solver_type):
    needs_layers()
    h5py = pytest.importorskip("h5py")
    s = make(tmp_path, solver_type, "hdf5")
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(2)
    s.snapshot()
    assert (tmp_path / "ls_iter_2.caffemodel.h5").exists()
    with h5py.File(tmp_path / "ls_iter_2.solverstate.h5", "r") as f:
        assert f["iter"].dtype == np.int32 and f["iter"].shape == (1,) and f["iter"][0] == 2
        assert f["current_step"][0] == 0  # iterations 0 and 1: before stepvalue 2
        tid = f["learned_net"].id.get_type()
        assert f["learned_net"].shape == ()
        assert tid.get_strpad() == h5py.h5t.STR_NULLTERM  # as H5LTmake_dataset_string writes it
        assert f["learned_net"][()].rstrip(b"\0").decode() == str(tmp_path / "ls_iter_2.caffemodel.h5")
        hist = f["history"]
        assert sorted(hist.keys(), key=int) == [str(i) for i in range(len(s.history))]
        for i, h in enumerate(s.history):
            assert hist[str(i)].dtype == np.float32
            np.testing.assert_array_equal(hist[str(i)][()], h.data)


def test_caffe_style_hdf5_state_without_learned_net(tmp_path):
    """A state without learned_net restores iter, step and history and leaves the weights alone."""
    needs_layers()
    h5py = pytest.importorskip("h5py")
    s = make(tmp_path, "SGD")
    shapes = [b.shape for b in s.net.learnable_params]
    path = tmp_path / "hand.solverstate.h5"
    with h5py.File(path, "w") as f:
        f["iter"] = np.array([7], np.int32)
        f["current_step"] = np.array([1], np.int32)
        g = f.create_group("history")
        for i, shape in enumerate(shapes):
            g[str(i)] = np.full(shape, i + 1, np.float32)
    before = [b.data.copy() for b in s.net.learnable_params]
    s.restore(str(path))
    assert s.iter == 7 and s.current_step == 1
    for i, h in enumerate(s.history):
        assert np.all(h.data == i + 1)
    for a, b in zip(before, s.net.learnable_params):
        np.testing.assert_array_equal(a, b.data)


def test_snapshot_diff_writes_the_gradients(tmp_path):
    needs_layers()
    s = make(tmp_path, "SGD", snapshot_diff=True)
    Feeder(random_batches(0, 1, NUM, DIM)).attach(s.net)
    s.step(1)
    s.snapshot()
    net_param = caffe_pb2.NetParameter()
    net_param.ParseFromString((tmp_path / "ls_iter_1.caffemodel").read_bytes())
    ip = [layer for layer in net_param.layer if layer.name == "ip"][0]
    assert len(ip.blobs[0].diff) == DIM


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_state_from_another_net_is_refused_and_changes_nothing(tmp_path, fmt):
    needs_layers()
    ext = ".solverstate.h5" if fmt == "hdf5" else ".solverstate"
    other = make(tmp_path, "Adam", fmt)  # Adam: 4 history blobs
    other.snapshot()
    sgd = make(tmp_path, "SGD", fmt)
    with pytest.raises(SolverError, match="incorrect length of history blobs: the file holds 4, this SGD solver "
                                          "needs 2"):
        sgd.restore(str(tmp_path / f"ls_iter_0{ext}"))
    assert sgd.iter == 0
    # same count, other shapes: a net with 5 inputs
    context.set_random_seed(0)
    wide = Solver(solver_param(least_squares_net(NUM, 5), type="SGD", base_lr=0.1, lr_policy="fixed",
                               snapshot_prefix=str(tmp_path / "wide"), snapshot_format=FORMATS[fmt]))
    wide.snapshot()
    with pytest.raises(SolverError, match=r"history blob 0 has shape \(1, 5\) but learnable param 0 "
                                          r"\(layer 'ip' param 0\) has shape \(1, 3\)"):
        sgd.restore(str(tmp_path / f"wide_iter_0{ext}"))
    assert sgd.iter == 0


def test_restore_errors_name_the_file(tmp_path):
    needs_layers()
    s = make(tmp_path, "SGD")
    with pytest.raises(SolverError, match="nothere.solverstate.*not found"):
        s.restore(str(tmp_path / "nothere.solverstate"))
    (tmp_path / "junk.solverstate").write_bytes(b"\xff\xff\xff")
    with pytest.raises(SolverError, match="junk.solverstate.*not a binary SolverState"):
        s.restore(str(tmp_path / "junk.solverstate"))
    (tmp_path / "junk.solverstate.h5").write_bytes(b"not hdf5")
    with pytest.raises(SolverError, match="cannot open HDF5 solver state"):
        s.restore(str(tmp_path / "junk.solverstate.h5"))


def test_atomic_path_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "x.solverstate"
    target.write_bytes(b"good")
    with pytest.raises(RuntimeError):
        with atomic_path(str(target)) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"good"
    assert os.listdir(tmp_path) == ["x.solverstate"]
    with atomic_path(str(target)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["x.solverstate"]


def test_legacy_4d_history_shapes_restore_and_train_on(tmp_path):
    # states of old Caffe versions store each history blob as num/channels/height/width
    needs_layers()
    s = make(tmp_path, "SGD")
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(2)
    state = caffe_pb2.SolverState(iter=2, current_step=0)
    for h in s.history:
        legacy = state.history.add()
        dims = (1,) * (4 - len(h.shape)) + tuple(h.shape)
        legacy.num, legacy.channels, legacy.height, legacy.width = dims
        legacy.data.extend(h.data.ravel().tolist())
    path = tmp_path / "legacy.solverstate"
    path.write_bytes(state.SerializeToString())
    other = make(tmp_path, "SGD", seed=9)
    other.restore(str(path))
    for a, b in zip(other.history, s.history):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.data, b.data)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(other.net)
    other.step(1)  # the restored history has the parameters' shapes: the update runs
    # a history blob of another shape is refused, naming the parameter
    bad = caffe_pb2.SolverState(iter=2)
    for i, h in enumerate(s.history):
        b = bad.history.add()
        b.num, b.channels, b.height, b.width = (1, 2, 1, h.count()) if i == 0 else (1, 1, 1, h.count())
        b.data.extend([0.0] * ((2 if i == 0 else 1) * h.count()))
    path.write_bytes(bad.SerializeToString())
    with pytest.raises(SolverError, match=r"history blob 0 has shape \(1, 2, 1, 3\) but learnable param 0 "
                                          r"\(layer 'ip' param 0\) has shape \(1, 3\)"):
        make(tmp_path, "SGD").restore(str(path))


def test_a_state_of_another_solver_type_is_refused_with_the_counts(tmp_path):
    needs_layers()
    s = make(tmp_path, "SGD", snapshot=1)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(1)
    with pytest.raises(SolverError, match=r"the file holds 2, this Adam solver needs 4 \(2 per learnable parameter "
                                          r"x 2 learnable parameters of net 'least_squares'\)"):
        make(tmp_path, "Adam").restore(str(tmp_path / "ls_iter_1.solverstate"))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_moved_snapshot_pair_restores_from_its_new_place(tmp_path, monkeypatch, fmt):
    # learned_net is relative to the current directory (as the prefix was); moved, it is found beside the state
    needs_layers()
    monkeypatch.chdir(tmp_path)
    context.set_random_seed(1)
    p = solver_param(least_squares_net(NUM, DIM), type="SGD", base_lr=0.05, lr_policy="fixed", momentum=0.9,
                     display=0, snapshot_prefix="a/ls", snapshot_format=FORMATS[fmt], snapshot_after_train=False)
    (tmp_path / "a").mkdir()
    s = Solver(p)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(2)
    s.snapshot()
    ext = ".h5" if fmt == "hdf5" else ""
    # a relative learned_net that exists is used as it is, even when the state's folder has a file of that name
    (tmp_path / "b").mkdir()
    os.replace(f"a/ls_iter_2.solverstate{ext}", f"b/ls_iter_2.solverstate{ext}")
    other = make(tmp_path, "SGD", fmt, seed=7)
    other.net.save(f"b/ls_iter_2.caffemodel{ext}") if fmt == "binary" else other.net.ToHDF5(f"b/ls_iter_2.caffemodel{ext}")
    resumed = make(tmp_path, "SGD", fmt, seed=5)
    resumed.restore(f"b/ls_iter_2.solverstate{ext}")
    for a, b in zip(resumed.net.learnable_params, s.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    # moved: the caffemodel is found next to the state
    os.replace(f"a/ls_iter_2.caffemodel{ext}", f"b/ls_iter_2.caffemodel{ext}")
    resumed = make(tmp_path, "SGD", fmt, seed=5)
    resumed.restore(f"b/ls_iter_2.solverstate{ext}")
    for a, b in zip(resumed.net.learnable_params, s.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    os.remove(f"b/ls_iter_2.caffemodel{ext}")
    with pytest.raises(SolverError, match=r"names learned_net 'a/ls_iter_2.caffemodel.*which was not found "
                                          r"\(relative to .* or next to the state file\)"):
        make(tmp_path, "SGD", fmt).restore(f"b/ls_iter_2.solverstate{ext}")


def test_binary_state_keeps_no_diffs(tmp_path):
    # (a state whose learned_net is present but empty is refused: test_solver_hardening.py)
    needs_layers()
    s = make(tmp_path, "SGD")
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(1)
    s.snapshot()
    state = caffe_pb2.SolverState()
    state.ParseFromString((tmp_path / "ls_iter_1.solverstate").read_bytes())
    assert len(state.history) == len(s.net.learnable_params)
    assert all(len(h.diff) == 0 for h in state.history)


def test_hdf5_snapshot_diff_and_learned_net_string(tmp_path):
    needs_layers()
    h5py = pytest.importorskip("h5py")
    s = make(tmp_path, "SGD", "hdf5", snapshot_diff=True)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(1)
    s.net.ClearParamDiffs()
    s.net.ForwardBackward()
    s.snapshot()
    with h5py.File(tmp_path / "ls_iter_1.caffemodel.h5", "r") as f:
        np.testing.assert_array_equal(f["diff/ip/0"][()], s.net.params["ip"][0].diff)
    with h5py.File(tmp_path / "ls_iter_1.solverstate.h5", "r") as f:
        name = str(tmp_path / "ls_iter_1.caffemodel.h5").encode()
        assert f["learned_net"].id.get_type().get_size() == len(name) + 1  # H5LT: the string and its NUL
        assert f["learned_net"][()] == name
    s = make(tmp_path, "SGD", "hdf5", snapshot_prefix=str(tmp_path / "nodiff"))
    s.snapshot()
    with h5py.File(tmp_path / "nodiff_iter_0.caffemodel.h5", "r") as f:
        assert "diff" not in f


def test_hdf5_state_fields_as_attributes_and_a_missing_current_step(tmp_path):
    # what other writers produce: scalars as attributes, no current_step (then 0)
    needs_layers()
    h5py = pytest.importorskip("h5py")
    s = make(tmp_path, "SGD", "hdf5")
    s.snapshot()
    path = tmp_path / "attrs.solverstate.h5"
    with h5py.File(path, "w") as f:
        f.attrs["iter"] = np.array([5], np.int32)
        f.attrs["learned_net"] = np.array([str(tmp_path / "ls_iter_0.caffemodel.h5").encode()])
        g = f.create_group("history")
        for i, b in enumerate(s.net.learnable_params):
            g[str(i)] = np.full(b.shape, 3, np.float32)
    other = make(tmp_path, "SGD", "hdf5", seed=9)
    other.current_step = 4
    other.restore(str(path))
    assert other.iter == 5 and other.current_step == 0
    for a, b in zip(other.net.learnable_params, s.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    with h5py.File(path, "a") as f:
        f.attrs["current_step"] = np.array([2], np.int32)
    other.restore(str(path))
    assert other.current_step == 2
