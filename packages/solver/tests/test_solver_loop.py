"""Solve/Step: Caffe's order of operations, testing, display lines, smoothing, actions, pycaffe surface."""
import logging
import os
import re
import signal

import numpy as np
import pytest

pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")

import caffe  # noqa: E402
from caffe.blob import context  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import NonFiniteLossError, SignalHandler, Solver, SolverAction  # noqa: E402
from caffe.solver.testing import Feeder, least_squares_net, net_param, random_batches, solver_param  # noqa: E402

NUM, DIM = 4, 3


def needs_layers():
    missing = {"Input", "InnerProduct", "EuclideanLoss"} - set(caffe.layer_type_list())
    if missing:
        pytest.skip(f"layers not implemented yet: {sorted(missing)}")


def make(tmp, **fields):
    context.set_random_seed(3)
    base = dict(type="SGD", base_lr=0.05, lr_policy="fixed", momentum=0.9, display=0,
                snapshot_prefix=str(tmp / "ls"), snapshot_after_train=False)
    base.update(fields)
    return Solver(solver_param(least_squares_net(NUM, DIM), **base))


def closed_form_loss(solver, batch):
    w = solver.net.params["ip"][0].data.astype(np.float64)
    b = solver.net.params["ip"][1].data.astype(np.float64)
    r = batch["data"].astype(np.float64) @ w.T + b - batch["targets"]
    return float((r ** 2).sum() / (2 * NUM))


class Recorder:
    """Wraps a solver's net and hooks to record the order of operations."""

    def __init__(self, solver):
        self.events = []
        net = solver.net
        for name in ("ClearParamDiffs", "ForwardBackward", "Update"):
            orig = getattr(net, name)
            setattr(net, name, self._wrap(name, orig))
        for i, tnet in enumerate(solver.test_nets):
            tnet.Forward = self._wrap(f"test{i}", tnet.Forward)
        snap = solver.Snapshot
        solver.Snapshot = self._wrap("snapshot", snap)
        solver.add_callback(lambda: self.events.append("on_start"),
                            lambda: self.events.append("on_gradients_ready"))

    def _wrap(self, name, fn):
        def run(*a, **k):
            self.events.append(name)
            return fn(*a, **k)
        return run


def test_step_runs_caffes_order(tmp_path):
    needs_layers()
    s = make(tmp_path, iter_size=2, test_iter=[2], test_interval=2, snapshot=2, max_iter=3)
    Feeder(random_batches(0, 3, NUM, DIM)).attach(s.net)
    rec = Recorder(s)
    s.step(3)
    it = ["on_start", "ForwardBackward", "ForwardBackward", "on_gradients_ready", "Update"]
    assert rec.events == (["ClearParamDiffs", "test0", "test0"] + it +
                          ["ClearParamDiffs"] + it + ["snapshot"] +
                          ["ClearParamDiffs", "test0", "test0"] + it)
    assert s.iter == 3


def test_solve_adds_the_after_training_snapshot_and_last_test(tmp_path):
    needs_layers()
    s = make(tmp_path, test_iter=[1], test_interval=2, max_iter=4, display=2, snapshot=3,
             snapshot_after_train=True, test_initialization=False)
    Feeder(random_batches(0, 3, NUM, DIM)).attach(s.net)
    rec = Recorder(s)
    s.solve()
    ev = [e for e in rec.events if e not in ("ClearParamDiffs", "on_start", "on_gradients_ready", "Update")]
    # no test at iteration 0 (test_initialization false); snapshot at 3; test at 2; after-training
    # snapshot at 4 (4 % 3 != 0); the final display forward (not recorded) and the final test at 4
    assert ev == ["ForwardBackward", "ForwardBackward", "test0", "ForwardBackward", "snapshot",
                  "ForwardBackward", "snapshot", "test0"]
    assert (tmp_path / "ls_iter_3.caffemodel").exists() and (tmp_path / "ls_iter_4.solverstate").exists()


def test_test_outputs_are_averaged_over_test_iter(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, test_iter=[3], test_interval=1, test_compute_loss=True)
    test_batches = random_batches(11, 3, NUM, DIM)
    Feeder(test_batches).attach(s.test_nets[0])
    assert s.test_nets[0].phase == caffe_pb2.TEST
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.Test(0)
    want = np.mean([closed_form_loss(s, b) for b in test_batches])
    assert s.mean_scores[0] == [pytest.approx(want, rel=1e-5)]
    text = caplog.text
    assert "Iteration 0, Testing net (#0)" in text
    m = re.search(r"    Test net output #0: loss = (\S+) \(\* 1 = (\S+) loss\)", text)
    assert m and float(m.group(1)) == pytest.approx(want, rel=1e-5) and m.group(1) == m.group(2)
    assert re.search(r"Test loss: \S+", text)


def test_display_lines_and_smoothed_loss(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, display=1, average_loss=3, max_iter=5, snapshot=5, snapshot_after_train=True)
    batches = random_batches(5, 5, NUM, DIM)
    Feeder(batches).attach(s.net)
    losses = []
    s.add_callback(lambda: None, lambda: losses.append(float(s.net.blobs["loss"].data)))
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.solve()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("caffe.solver")]
    shown = [float(m.group(2)) for line in lines
             if (m := re.fullmatch(r"Iteration (\d+) \(\S+ iter/s, \S+s/1 iters\), loss = (\S+)", line))]
    want = [np.mean(losses[max(0, i - 2):i + 1]) for i in range(5)]
    np.testing.assert_allclose(shown, want, rtol=1e-5)
    assert sum(bool(re.fullmatch(r"    Train net output #0: loss = \S+ \(\* 1 = \S+ loss\)", x)) for x in lines) == 5
    assert [x for x in lines if x.startswith("Iteration 0, lr = ")] == ["Iteration 0, lr = 0.05"]
    prefix = str(tmp_path / "ls")
    assert f"Snapshotting to binary proto file {prefix}_iter_5.caffemodel" in lines
    assert f"Snapshotting solver state to binary proto file {prefix}_iter_5.solverstate" in lines
    assert "Solving least_squares" in lines and "Learning Rate Policy: fixed" in lines
    # the last forward pass (no update) joins the smoothing window, in the slot of iteration 2 (Caffe's Solve)
    final = float(s.net.blobs["loss"].data)
    m = re.fullmatch(r"Iteration 5, loss = (\S+)", [x for x in lines if x.startswith("Iteration 5")][0])
    np.testing.assert_allclose(float(m.group(1)), np.mean([losses[3], losses[4], final]), rtol=1e-5)
    assert lines[-1] == "Optimization Done."


def test_requested_snapshot_and_stop(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, max_iter=10, snapshot_after_train=True)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    answers = iter(["none", SolverAction.SNAPSHOT, "none", SolverAction.STOP])
    s.set_action_function(lambda: next(answers, SolverAction.NONE))
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.solve()
    # SNAPSHOT after the 2nd update, STOP after the 4th; Solve then writes its after-training snapshot
    assert s.iter == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ls_iter_2.caffemodel", "ls_iter_2.solverstate",
                                                          "ls_iter_4.caffemodel", "ls_iter_4.solverstate"]
    assert "Optimization stopped early." in caplog.text
    assert "Optimization Done." not in caplog.text


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_signals_drive_the_solver(tmp_path, caplog):
    """SIGHUP (snapshot) during iteration 1 and SIGINT (stop) during iteration 3, through SignalHandler."""
    needs_layers()
    s = make(tmp_path, max_iter=10, snapshot_after_train=True)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    sent = {1: signal.SIGHUP, 3: signal.SIGINT}
    s.add_callback(lambda: os.kill(os.getpid(), sent[s.iter]) if s.iter in sent else None, None)
    with SignalHandler(sigint_effect="stop", sighup_effect="snapshot") as handler:
        s.SetActionFunction(handler.GetActionFunction())
        with caplog.at_level(logging.INFO, logger="caffe"):
            s.solve()
    assert s.iter == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ls_iter_2.caffemodel", "ls_iter_2.solverstate",
                                                          "ls_iter_4.caffemodel", "ls_iter_4.solverstate"]
    assert "Optimization stopped early." in caplog.text


def test_stop_during_testing_interrupts_the_test(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, max_iter=10, test_iter=[5], test_interval=1)
    rec = Recorder(s)
    answers = iter(["none", "none", "stop"])
    s.set_action_function(lambda: next(answers, "none"))
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.solve()
    assert s.iter == 0 and rec.events.count("test0") == 2
    assert "Test interrupted." in caplog.text


def test_nan_loss_stops_before_the_update_and_keeps_the_snapshot(tmp_path):
    needs_layers()
    s = make(tmp_path, max_iter=10, snapshot=2, snapshot_after_train=True)
    batches = random_batches(0, 4, NUM, DIM)
    batches[3] = dict(batches[3], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(s.net)
    with pytest.raises(NonFiniteLossError, match=r"Iteration 3: the training loss is nan.*ls_iter_2"):
        s.solve()
    assert s.iter == 3
    assert all(np.isfinite(b.data).all() for b in s.net.learnable_params)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ls_iter_2.caffemodel", "ls_iter_2.solverstate"]


def test_pycaffe_surface(tmp_path):
    needs_layers()
    net_file = tmp_path / "ls.prototxt"
    net_file.write_text(least_squares_net(NUM, DIM))
    solver_file = tmp_path / "ls_solver.prototxt"
    solver_file.write_text(f'net: "{net_file}" type: "Adam" base_lr: 0.01 lr_policy: "fixed" '
                           f'momentum: 0.9 test_iter: 1 test_interval: 5 max_iter: 2')
    s = caffe.get_solver(str(solver_file))
    assert type(s).__name__ == "AdamSolver" and s.type == "Adam"
    assert isinstance(caffe.Solver(str(solver_file)), caffe.AdamSolver)
    sgd = caffe.SGDSolver(str(solver_file))  # as in pycaffe, the class decides the type
    assert type(sgd).__name__ == "SGDSolver"
    assert s.param.snapshot_prefix == str(tmp_path / "ls_solver") and s.solver_params is s.param
    assert len(s.test_nets) == 1 and s.test_nets[0].phase == caffe.TEST and s.net.phase == caffe.TRAIN
    calls = []

    class CB:
        def on_start(self):
            calls.append("start")

        def on_gradients_ready(self):
            calls.append("ready")

    s.add_callback(CB())
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.step(2)
    assert calls == ["start", "ready"] * 2 and s.iter == 2
    other = caffe.Net(str(net_file), caffe.TEST)
    s.share_weights(other)
    np.testing.assert_array_equal(other.params["ip"][0].data, s.net.params["ip"][0].data)
    s.net.ClearParamDiffs()
    s.net.ForwardBackward()
    before = s.net.params["ip"][0].data.copy()
    s.apply_update()
    assert not np.array_equal(before, s.net.params["ip"][0].data)
    assert s.iter == 2  # apply_update alone does not count an iteration (as pycaffe)
    for name in ("SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver",
                 "AdamSolver", "get_solver", "Solver"):
        assert getattr(caffe, name) is getattr(caffe.solver, name)


def test_net_and_weights_paths_are_relative_to_the_cwd(tmp_path, monkeypatch):
    needs_layers()
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "ls.prototxt").write_text(least_squares_net(NUM, DIM))
    s = make(tmp_path)
    s.net.params["ip"][0].data[...] = 1.5
    s.net.Save(str(tmp_path / "nets" / "init.caffemodel"))
    (tmp_path / "nets" / "solver.prototxt").write_text(
        'net: "nets/ls.prototxt" weights: "nets/init.caffemodel" base_lr: 0.1 lr_policy: "fixed" '
        'test_iter: 1 test_interval: 1')
    monkeypatch.chdir(tmp_path)
    s = Solver("nets/solver.prototxt")
    assert np.all(s.net.params["ip"][0].data == 1.5) and np.all(s.test_nets[0].params["ip"][0].data == 1.5)
    assert s.param.snapshot_prefix == "nets/solver"


def test_train_net_and_test_net_files(tmp_path, monkeypatch):
    needs_layers()
    (tmp_path / "train.prototxt").write_text(least_squares_net(NUM, DIM, name="train"))
    (tmp_path / "test.prototxt").write_text(least_squares_net(2 * NUM, DIM, name="test"))
    p = solver_param(None, train_net="train.prototxt", test_net=["test.prototxt"], test_iter=[2, 1],
                     test_interval=1, base_lr=0.1, lr_policy="fixed")
    p.test_net_param.add().CopyFrom(net_param(least_squares_net(NUM, DIM, name="inline")))
    monkeypatch.chdir(tmp_path)
    s = Solver(p)
    # test_net_param nets come first, then test_net files (Caffe's order)
    assert [n.name for n in s.test_nets] == ["inline", "test"] and s.net.name == "train"
    assert s.test_nets[1].blobs["data"].shape == (2 * NUM, DIM)


def test_train_state_and_test_state_select_layers(tmp_path):
    """The stage-filtered layer exists only in the net whose state names its stage."""
    needs_layers()
    text = least_squares_net(NUM, DIM) + (
        'layer { name: "extra" type: "EuclideanLoss" bottom: "ip" bottom: "targets" top: "extra" '
        'include { stage: "more" } }\n')
    p = solver_param(text, base_lr=0.1, lr_policy="fixed", test_iter=[1, 1], test_interval=1)
    p.train_state.stage.append("more")
    p.test_state.add()
    p.test_state.add().stage.append("more")
    s = Solver(p)
    assert "extra" in s.net.layer_names
    assert "extra" not in s.test_nets[0].layer_names and "extra" in s.test_nets[1].layer_names
    assert all(t.phase == caffe.TEST for t in s.test_nets)


# -- what Caffe users read off the log (parse_log.py), at every display interval ---------------------------
def weighted_net():
    """The least-squares net with loss_weight 2 and a second, non-loss output of 4 values (`ipcopy`)."""
    text = least_squares_net(NUM, DIM).replace('top: "loss" }', 'top: "loss" loss_weight: 2 }')
    return text + 'layer { name: "copy" type: "Power" bottom: "ip" top: "ipcopy" }\n'


def solver_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("caffe.solver")]


def test_display_interval_lines_numbering_and_loss_weights(tmp_path, caplog):
    needs_layers()
    context.set_random_seed(3)
    p = solver_param(weighted_net(), type="SGD", base_lr=0.01, lr_policy="fixed", display=2, max_iter=5,
                     test_iter=[3], test_interval=4, test_initialization=False, test_compute_loss=True,
                     snapshot_prefix=str(tmp_path / "ls"), snapshot_after_train=False)
    s = Solver(p)
    Feeder(random_batches(1, 5, NUM, DIM)).attach(s.net)
    test_batches = random_batches(9, 3, NUM, DIM)
    Feeder(test_batches).attach(s.test_nets[0])
    test_losses = []
    s.test_nets[0].after_forward(lambda i: test_losses.append(float(s.test_nets[0].blobs["loss"].data))
                                 if i == len(s.test_nets[0].layers) - 1 else None)
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.step(5)
    lines = solver_lines(caplog)
    # the rate and the loss lines at iterations 0, 2, 4 only
    assert [int(x.split()[1].rstrip(",")) for x in lines if re.fullmatch(r"Iteration \d+, lr = 0\.01", x)] == [0, 2, 4]
    shown = [m for x in lines if (m := re.fullmatch(r"Iteration (\d+) \((\S+) iter/s, (\S+)s/2 iters\), loss = \S+", x))]
    assert [int(m.group(1)) for m in shown] == [0, 2, 4]
    for m in shown[1:]:  # iter/s times the seconds since the last display line: the 2 iterations between
        assert float(m.group(2)) * float(m.group(3)) == pytest.approx(2, rel=1e-4)
    # outputs numbered across blobs and their elements; the loss carries its weight, the copy none
    outs = [x for x in lines if x.startswith("    Train net output #")][:5]
    names = [re.match(r"    Train net output #(\d+): (\w+) = ", x).groups() for x in outs]
    assert names == [("0", "ipcopy"), ("1", "ipcopy"), ("2", "ipcopy"), ("3", "ipcopy"), ("4", "loss")]
    assert all(re.fullmatch(r"    Train net output #\d: ipcopy = [-+.\deE]+", x) for x in outs[:4])  # no "(* 0 ...)"
    m = re.fullmatch(r"    Train net output #4: loss = (\S+) \(\* 2 = (\S+) loss\)", outs[4])
    assert m and float(m.group(2)) == pytest.approx(2 * float(m.group(1)), rel=1e-5)
    # the test pass at iteration 4: outputs averaged over test_iter, numbered the same way; the test loss
    # is the mean of the forward passes' (weighted) losses
    touts = [x for x in lines if x.startswith("    Test net output #")]
    assert [re.match(r"    Test net output #(\d+): (\w+)", x).groups() for x in touts] == names
    assert all(re.fullmatch(r"    Test net output #\d: ipcopy = [-+.\deE]+", x) for x in touts[:4])
    m = re.fullmatch(r"    Test net output #4: loss = (\S+) \(\* 2 = (\S+) loss\)", touts[4])
    assert m and float(m.group(1)) == pytest.approx(np.mean(test_losses), rel=1e-5)
    loss_line = [x for x in lines if x.startswith("Test loss: ")]
    assert len(test_losses) == 3 and loss_line
    assert float(loss_line[0].split(": ")[1]) == pytest.approx(2 * np.mean(test_losses), rel=1e-5)


def test_iter_size_loss_is_the_mean_of_its_passes(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, display=1, iter_size=2)
    batches = random_batches(2, 4, NUM, DIM)
    Feeder(batches).attach(s.net)
    want = np.mean([closed_form_loss(s, b) for b in batches[:2]])  # the weights of iteration 0
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.step(1)
    m = [m for x in solver_lines(caplog) if (m := re.fullmatch(r"Iteration 0 \(.*\), loss = (\S+)", x))]
    assert m and float(m[0].group(1)) == pytest.approx(want, rel=1e-5)


def test_smoothed_loss_restarts_with_each_step_call(tmp_path, caplog):
    # Caffe's Step keeps its own window of the last average_loss losses, indexed from the call's first iteration
    needs_layers()
    s = make(tmp_path, display=1, average_loss=3)
    Feeder(random_batches(5, 7, NUM, DIM)).attach(s.net)
    losses = []
    s.add_callback(lambda: None, lambda: losses.append(float(s.net.blobs["loss"].data)))
    s.step(2)
    losses.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.step(5)
    shown = [float(m.group(1)) for x in solver_lines(caplog)
             if (m := re.fullmatch(r"Iteration \d+ \(.*\), loss = (\S+)", x))]
    want = [np.mean(losses[max(0, i - 2):i + 1]) for i in range(5)]
    np.testing.assert_allclose(shown, want, rtol=1e-5)


def test_test_interval_1_without_test_initialization(tmp_path):
    needs_layers()
    s = make(tmp_path, test_iter=[1], test_interval=1, test_initialization=False)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    rec = Recorder(s)
    s.step(3)
    # no test before the first update; then one before each of iterations 1 and 2
    assert [e for e in rec.events if e in ("test0", "Update")] == ["Update", "test0", "Update", "test0", "Update"]


def test_after_training_snapshot_only_when_asked_and_only_once(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, max_iter=3, snapshot_after_train=False)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    s.solve()
    assert list(tmp_path.iterdir()) == []
    s = make(tmp_path, max_iter=4, snapshot=2, snapshot_after_train=True)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.solve()
    # the schedule has just written iteration 4's snapshot: Solve does not write it again
    assert sum("ls_iter_4.caffemodel" in x for x in solver_lines(caplog)) == 1


def test_random_seed_0_and_the_rank_offset(tmp_path):
    # random_seed 0 is a seed (only a negative value leaves the generator alone); each rank seeds with
    # random_seed + solver_rank, as Caffe's Solver::Init
    needs_layers()

    def weights(seed, rank=0, scramble=0):
        context.set_random_seed(1000 + scramble)  # whatever state the generator was left in
        context.set_solver_rank(rank)
        try:
            p = solver_param(least_squares_net(NUM, DIM), base_lr=0.1, lr_policy="fixed", random_seed=seed)
            return Solver(p).net.params["ip"][0].data.copy()
        finally:
            context.set_solver_rank(0)

    np.testing.assert_array_equal(weights(0, scramble=1), weights(0, scramble=2))
    np.testing.assert_array_equal(weights(5, rank=1), weights(6, rank=0))
    assert not np.array_equal(weights(5, rank=1), weights(5, rank=0))


def test_nonfinite_loss_message_names_the_weights_and_the_snapshot(tmp_path):
    needs_layers()
    s = make(tmp_path, max_iter=10)
    bad = random_batches(0, 1, NUM, DIM)[0]
    Feeder([dict(bad, data=np.full((NUM, DIM), np.inf, np.float32))]).attach(s.net)
    with pytest.raises(NonFiniteLossError, match=r"^Iteration 0: the training loss is (inf|-?nan); training stopped "
                                                 r"before this iteration's update \(weights are those after "
                                                 r"iteration 0 updates\), no snapshot was written\."):
        s.solve()
    s = make(tmp_path, max_iter=10, snapshot=2)
    batches = random_batches(0, 4, NUM, DIM)
    batches[3] = dict(batches[3], data=np.full((NUM, DIM), np.nan, np.float32))
    Feeder(batches).attach(s.net)
    prefix = re.escape(str(tmp_path / "ls_iter_2"))
    with pytest.raises(NonFiniteLossError, match=rf"after iteration 2 updates\), the last snapshot \({prefix}"
                                                 rf"\.caffemodel, {prefix}\.solverstate\) is left as it was\."):
        s.solve()


def test_debug_info_only_on_display_iterations(tmp_path, caplog):
    needs_layers()
    s = make(tmp_path, display=2, debug_info=True)
    Feeder(random_batches(0, 2, NUM, DIM)).attach(s.net)
    per_iter = []
    s.add_callback(lambda: per_iter.append(len(caplog.records)), None)
    with caplog.at_level(logging.INFO, logger="caffe"):
        s.step(4)
    per_iter.append(len(caplog.records))
    forward = [sum("[Forward]" in r.getMessage() for r in caplog.records[a:b])
               for a, b in zip(per_iter, per_iter[1:])]
    assert forward[0] > 0 and forward[2] > 0 and forward[1] == 0 and forward[3] == 0


def test_solver_repr_and_where_errors_come_from(tmp_path):
    needs_layers()
    s = make(tmp_path)
    assert repr(s) == "<SGDSolver iter=0 net='least_squares'>"
    with pytest.raises(caffe.solver.SolverError, match=r"^SolverParameter: snapshot is specified but "
                                                       r"snapshot_prefix is not"):
        Solver(solver_param(least_squares_net(NUM, DIM), base_lr=0.1, lr_policy="fixed", snapshot=2))
    f = tmp_path / "s.prototxt"
    f.write_text('net: "missing.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    with pytest.raises(caffe.solver.SolverError, match=rf"^solver {re.escape(repr(str(f)))}: net file "):
        Solver(str(f))


def test_weights_lists_load_in_order_and_skip_empty_entries(tmp_path):
    needs_layers()
    s = make(tmp_path)
    for value, name in ((1.0, "one"), (2.0, "two")):
        s.net.params["ip"][0].data[...] = value
        s.net.Save(str(tmp_path / f"{name}.caffemodel"))
    w = f"{tmp_path / 'one.caffemodel'},,{tmp_path / 'two.caffemodel'}"
    s = Solver(solver_param(least_squares_net(NUM, DIM), base_lr=0.1, lr_policy="fixed", weights=[w]))
    assert np.all(s.net.params["ip"][0].data == 2.0)  # both loaded, the last one wins


def test_only_the_root_solver_solves_and_snapshots(tmp_path):
    needs_layers()
    s = make(tmp_path)
    context.set_solver_rank(1)
    try:
        with pytest.raises(caffe.solver.SolverError, match=r"^Solve must be called on the root solver$"):
            s.solve()
        with pytest.raises(caffe.solver.SolverError, match=r"^Snapshot must be called on the root solver$"):
            s.snapshot()
    finally:
        context.set_solver_rank(0)
