"""Faults in multi-rank training end the job with a clear message instead of hanging.

Deterministic under load: the failing rank fails only after a handshake with the others (so they report
the fault's iteration whatever the scheduler does), the watchdog's short timeout applies only from there
on, and how soon the job ends is measured against the job's own pace (_mpi.Run.ended_promptly_after_fault)
rather than a fixed number of seconds.
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_parallel_mpi_helpers", Path(__file__).with_name("_mpi.py"))
_mpi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mpi)


@pytest.fixture
def selftest(tmp_path):
    pytest.importorskip("caffe.solver", reason="caffe-solver is not installed")

    def run(n, *args, mpi_flags=()):
        return _mpi.run_mpi(n, ["-m", "caffe.parallel.selftest", "--workdir", tmp_path, *args], mpi_flags=mpi_flags)
    return run


def test_a_rank_that_raises_stops_the_job_naming_itself(selftest):
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = selftest(2, "--fail-rank", "1", "--fail-iter", "2", "--fail-mode", "raise")
    assert run.returncode == EXIT_ABORT, run.err
    assert run.ended_promptly_after_fault(), (run.fault_at, run.after_fault)
    assert "rank 1 of 2" in run.err
    assert "failed at iteration 2: RuntimeError: injected failure on rank 1" in run.err
    assert run.err.count("failed at iteration 2") == 1  # said once, however the abort went


def test_a_hung_rank_is_stopped_by_the_watchdog(selftest):
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = selftest(2, "--fail-rank", "1", "--fail-iter", "2", "--fail-mode", "hang", "--timeout", "2")
    assert run.returncode == EXIT_ABORT, run.err
    assert run.ended_promptly_after_fault(2), (run.fault_at, run.after_fault)
    assert "rank 0 of 2" in run.err and "at iteration 2 has waited" in run.err and "over the 2 s timeout" in run.err


def test_a_rank_that_dies_is_named_by_the_others(selftest):
    # mpiexec's own clean-up off: the watchdog of the surviving ranks notices the dead process
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = selftest(3, "--fail-rank", "1", "--fail-iter", "2", "--fail-mode", "exit",
                   mpi_flags=["-disable-auto-cleanup"])
    assert run.returncode == EXIT_ABORT, run.err
    assert run.ended_promptly_after_fault(), (run.fault_at, run.after_fault)
    assert "rank 1 (pid" in run.err and "exited while this rank waited in" in run.err, run.err
    assert "at iteration 2" in run.err, run.err
    # MPI_Abort returns under -disable-auto-cleanup: each surviving rank still says it once, not once per poll
    assert 1 <= run.err.count("stopping all ranks (MPI_Abort)") <= 2, run.err


def test_a_rank_that_dies_ends_the_job_under_plain_mpiexec(selftest):
    run = selftest(2, "--fail-rank", "1", "--fail-iter", "2", "--fail-mode", "exit")
    assert run.returncode != 0 and run.ended_promptly_after_fault(), (run.fault_at, run.after_fault)
    assert '"ok"' not in run.out


def test_solver_files_that_differ_between_ranks_are_refused(selftest):
    rc, out, err, _ = selftest(3, "--skew-rank", "2")
    assert rc != 0
    assert "the solver or net definitions differ between ranks (ranks [2] disagree with ranks [0, 1])" in err
    assert "rank 2 on" in err and "solver_skew2.prototxt" in err  # each rank's solver file is named


def test_python_layers_in_multi_rank_training(selftest):
    # share_in_parallel: true cannot hold across processes: refused with Caffe's reason
    rc, out, err, _ = selftest(2, "--python-layer", "shared")
    assert rc != 0
    assert "sets python_param.share_in_parallel: true" in err and "because of the GIL" not in err
    assert "cannot share one layer instance" in err
    # a plain Python layer runs in every rank (as Caffe's train.py allows), with one warning from rank 0
    rc, out, err, _ = selftest(2, "--python-layer", "plain")
    assert rc == 0, err
    assert err.count("runs in each of the 2 rank processes") == 1
    assert '"ok": true' in out
