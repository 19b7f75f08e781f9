"""N ranks of batch b train exactly like one solver of batch N*b (through mpiexec, on CPUs).

Each case runs `python -m caffe.parallel.selftest` on N ranks: a tiny LMDB read by the Data layer
(each rank its own share), an InnerProduct-ReLU-InnerProduct-SoftmaxWithLoss net, momentum and weight
decay. The selftest compares every rank's weights at every iteration (bitwise) and the trajectory with
one solver of batch N*b started from the same weights (float32 tolerance).
"""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_parallel_mpi_helpers", Path(__file__).with_name("_mpi.py"))
_mpi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mpi)


@pytest.fixture
def selftest(tmp_path):
    pytest.importorskip("caffe.solver", reason="caffe-solver is not installed")

    def run(n, *args):
        rc, out, err, _ = _mpi.run_mpi(n, ["-m", "caffe.parallel.selftest", "--workdir", tmp_path, *args])
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return rc, reports[0] if reports else None, err
    return run


@pytest.mark.parametrize("n, solver, reduce", [
    (2, "SGD", "layer-wise"), (2, "Adam", "whole"), (3, "Nesterov", "layer-wise"), (3, "SGD", "whole"),
])
def test_ranks_match_one_solver_with_n_times_the_batch(selftest, n, solver, reduce):
    args = ["--type", solver, "--iters", "4", "--batch", "2"] + (["--whole-reduce"] if reduce == "whole" else [])
    rc, report, err = selftest(n, *args)
    assert report is not None, err
    assert report["ranks"] == n and report["layer_wise"] == (reduce == "layer-wise")
    assert report["iters"] == [0, 1, 2, 3, 4]
    assert report["ranks_identical_every_iteration"], report
    assert report["matches_single_solver"], report
    assert report["ok"] and rc == 0, (report, err)


def test_resume_restores_every_rank(selftest):
    # train to iteration 2 with a snapshot, then every rank restores it (weights, momentum, iter) and goes on
    # to 5; one solver of batch N*b resumed from the same snapshot must match
    rc, report, err = selftest(2, "--resume-from", "2", "--iters", "5")
    assert report is not None, err
    assert report["resumed_from"] == 2 and report["iters"] == [2, 3, 4, 5]
    assert report["ranks_identical_every_iteration"] and report["matches_single_solver"], report
    assert rc == 0


def test_the_comparison_catches_a_rank_with_wrong_gradients(selftest):
    # negative control: rank 1 doubles its local gradients; ranks stay identical, the trajectory must not match
    rc, report, err = selftest(2, "--perturb-rank", "1", "--whole-reduce")
    assert report is not None, err
    assert report["ranks_identical_every_iteration"]
    assert not report["matches_single_solver"] and not report["ok"]
    assert rc != 0


def test_a_stop_request_on_one_rank_stops_every_rank_at_the_same_iteration(selftest):
    # rank 1 alone gets SIGINT (sigint_effect stop) after iteration 2's update: all three ranks stop there
    rc, report, err = selftest(3, "--iters", "5", "--signal-rank", "1", "--signal-iter", "2", "--signal", "stop")
    assert report is not None, err
    assert report["iters"] == [0, 1, 2] and report["ranks_identical_every_iteration"] and report["ok"], report
    assert rc == 0


def test_snapshots_come_from_rank_0_also_when_another_rank_asks(selftest):
    # a snapshot every 2 iterations, and rank 1 alone gets SIGHUP (snapshot) after iteration 3's update
    rc, report, err = selftest(2, "--iters", "4", "--snapshot", "2", "--signal-rank", "1", "--signal-iter", "3",
                               "--signal", "snapshot")
    assert report is not None, err
    assert report["snapshots"] == [f"snap_iter_{i}.{ext}" for i in (2, 3, 4) for ext in ("caffemodel", "solverstate")]
    assert report["ok"] and rc == 0, report


def test_a_stop_during_rank_0s_test_pass_stops_every_rank_after_the_next_update(selftest):
    # rank 0 tests at iteration 0 (the others do not) and is asked to stop there: ending its Step at once would
    # leave the other ranks waiting in their allreduce; the stop is kept for the next update instead
    # (were the stop not kept, rank 1 would wait in its allreduce for ever: the harness's hang guard fails it)
    rc, report, err = selftest(2, "--iters", "5", "--test-interval", "2", "--signal-rank", "0", "--signal-call", "1")
    assert report is not None, err
    assert report["iters"] == [0, 1] and report["ranks_identical_every_iteration"] and report["ok"], report
    assert rc == 0
