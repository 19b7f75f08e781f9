"""Boundaries the solver's mutation run showed untested: net-file errors without a solver file, rms_decay 0,
solvers built directly by their class, Test() with its default net and with test_iter 0, an HDF5 state
whose learned_net path has a space, integer actions."""
import logging
import re

import numpy as np
import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import AdaDeltaSolver, AdamSolver, RMSPropSolver, Solver, SolverAction, SolverError  # noqa: E402
from caffe.solver.signals import action_from_string  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, random_batches, solver_param  # noqa: E402

NUM, DIM = 4, 3


def needs_layers():
    missing = {"Input", "InnerProduct", "EuclideanLoss"} - set(caffe.layer_type_list())
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


def make(tmp, **fields):
    context.set_random_seed(3)
    base = dict(type="SGD", base_lr=0.05, lr_policy="fixed", display=0, snapshot_prefix=str(tmp / "ls"),
                snapshot_after_train=False)
    base.update(fields)
    return Solver(solver_param(least_squares_net(NUM, DIM), **base))


def test_missing_net_file_without_a_solver_file_or_a_file_beside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    param = caffe_pb2.SolverParameter(net="missing.prototxt", base_lr=0.1, lr_policy="fixed")
    # no solver file: the error names the SolverParameter, and there is nowhere to look for a hint
    with pytest.raises(SolverError, match=r"^SolverParameter: net file 'missing.prototxt' not found \(net paths "
                                          r"are relative to the current directory .*, as in Caffe\)$"):
        Solver(param)
    # a solver file in a folder (which exists) without the net beside it: no hint either
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "solver.prototxt").write_text('net: "missing.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    with pytest.raises(SolverError, match=r"^solver 'sub/solver.prototxt': net file 'missing.prototxt' not "
                                          r"found .*, as in Caffe\)$"):
        Solver("sub/solver.prototxt")


def test_rms_decay_0_is_allowed_and_1_is_not(tmp_path):
    needs_layers()
    s = make(tmp_path, type="RMSProp", rms_decay=0.0)  # Caffe: CHECK_GE(rms_decay, 0), CHECK_LT(rms_decay, 1)
    Feeder(random_batches(0, 1, NUM, DIM)).attach(s.net)
    s.step(1)
    assert s.iter == 1
    with pytest.raises(SolverError, match=r"rms_decay should lie between 0 and 1 \(got 1"):
        make(tmp_path, type="RMSProp", rms_decay=1.0)


@pytest.mark.parametrize("cls", [AdamSolver, AdaDeltaSolver, RMSPropSolver])
def test_solver_classes_build_directly_from_a_parameter_or_a_file(tmp_path, cls):
    """pycaffe's caffe.AdamSolver('solver.prototxt'): the class builds its own type from either."""
    needs_layers()
    param = solver_param(least_squares_net(NUM, DIM), base_lr=0.1, lr_policy="fixed", momentum=0.0,
                         momentum2=0.999, delta=1e-6, snapshot_prefix=str(tmp_path / "ls"))
    path = tmp_path / "solver.prototxt"
    path.write_text(str(param))
    for source in (param, str(path)):
        s = cls(source)
        assert type(s) is cls  # whatever the parameter's type (SGD here), as pycaffe's classes
        assert s.net.name == "least_squares" and s.param.base_lr == pytest.approx(0.1)
        n = len(s.net.learnable_params)
        assert len(s.history) == (2 * n if cls in (AdamSolver, AdaDeltaSolver) else n)


def test_test_defaults_to_the_first_test_net(tmp_path):
    needs_layers()
    s = make(tmp_path, test_iter=[1], test_interval=10)
    Feeder(random_batches(5, 1, NUM, DIM)).attach(s.test_nets[0])
    s.Test()
    assert len(s.mean_scores[0]) == 1 and np.isfinite(s.mean_scores[0][0])


def test_test_iter_0_gives_a_nan_test_loss_and_no_scores(tmp_path, caplog):
    """Caffe divides the summed test loss by test_iter: 0 iterations give NaN, not a crash."""
    needs_layers()
    s = make(tmp_path, test_iter=[0], test_interval=10, test_compute_loss=True)
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.Test(0)
    assert re.search(r"Test loss: -?nan", caplog.text)
    assert s.mean_scores[0] == []


def test_hdf5_state_restores_a_learned_net_path_with_spaces(tmp_path):
    needs_layers()
    pytest.importorskip("h5py")
    folder = tmp_path / "my snapshots"
    folder.mkdir()
    s = make(folder, snapshot_format=caffe_pb2.SolverParameter.HDF5)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(2)
    s.snapshot()
    want = [b.data.copy() for b in s.net.learnable_params]
    fresh = make(folder, snapshot_format=caffe_pb2.SolverParameter.HDF5)
    fresh.restore(str(folder / "ls_iter_2.solverstate.h5"))
    assert fresh.iter == 2
    for blob, w in zip(fresh.net.learnable_params, want):
        np.testing.assert_array_equal(blob.data, w)


def test_actions_given_as_integers():
    for action in SolverAction:
        assert action_from_string(int(action)) is action


def test_test_scores_accumulate_in_the_nets_dtype(tmp_path):
    """Caffe sums the test outputs in Dtype (float32) and divides by test_iter in Dtype: the means are
    exactly those float32 figures, not float64 ones."""
    needs_layers()
    n_iter = 5
    s = make(tmp_path, test_iter=[n_iter], test_interval=10)
    net = s.test_nets[0]
    Feeder(random_batches(11, n_iter, NUM, DIM)).attach(net)
    seen = []
    forward = net.Forward

    def recording_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append(np.float32(net.output_blobs[0].data.ravel()[0]))
        return out
    net.Forward = recording_forward
    s.Test(0)
    total = np.float32(0)
    for v in seen:
        total = np.float32(total + v)
    want = np.float32(total / np.float32(n_iter))
    assert len(seen) == n_iter
    assert s.mean_scores[0] == [float(want)]
    assert float(want) != float(np.float64(sum(map(np.float64, seen))) / n_iter)  # the two sums do differ here
