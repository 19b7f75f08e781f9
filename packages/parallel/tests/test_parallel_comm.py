"""MPICommunicator under mpiexec: the collectives, and the watchdog that stops a job instead of hanging."""
import importlib.util
import re
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_parallel_mpi_helpers", Path(__file__).with_name("_mpi.py"))
_mpi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mpi)

WORKER = Path(__file__).with_name("_mpi_comm_worker.py")


def test_collectives_three_ranks():
    rc, out, err, _ = _mpi.run_mpi(3, [WORKER, "collectives"])
    assert rc == 0, err
    # the ranks' lines may arrive interleaved: look for each one anywhere in the output
    assert sorted(re.findall(r"rank (\d) of 3: collectives ok", out)) == ["0", "1", "2"]


# The fault cases are deterministic under load: rank 1 fails only after a handshake with the others (see
# _mpi_comm_worker.fault), the short timeout applies only from there on, and how soon the job ends is
# measured against the job's own pace (_mpi.Run.ended_promptly_after_fault), not a fixed number of seconds.

def test_hung_rank_is_stopped_by_the_timeout():
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = _mpi.run_mpi(2, [WORKER, "fault", "hang", "1.5"])
    assert run.returncode == EXIT_ABORT, (run.returncode, run.err)
    assert run.ended_promptly_after_fault(1.5), (run.fault_at, run.after_fault)
    assert "rank 0 of 2" in run.err and "allreduce at iteration 2 has waited" in run.err and "1.5 s timeout" in run.err
    assert "CAFFE_PARALLEL_TIMEOUT" in run.err


def test_dead_rank_is_named_when_the_launcher_does_not_clean_up():
    # mpiexec's own clean-up is off: only the watchdog stands between the other ranks and a hang
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = _mpi.run_mpi(3, [WORKER, "fault", "exit"], mpi_flags=["-disable-auto-cleanup"])
    assert run.returncode == EXIT_ABORT, (run.returncode, run.err)
    assert run.ended_promptly_after_fault(), (run.fault_at, run.after_fault)
    assert "rank 1 (pid" in run.err and "exited while this rank waited in allreduce at iteration 2" in run.err, run.err
    # hydra's MPI_Abort returns here: each surviving rank still says it once, not once per watchdog poll
    assert 1 <= run.err.count("stopping all ranks (MPI_Abort)") <= 2, run.err


@pytest.mark.parametrize("kind", ["exit", "kill"])
def test_dead_rank_ends_the_job_with_default_launcher(kind):
    # MPICH's mpiexec stops the job itself when a rank dies: the job ends at once, never hangs
    run = _mpi.run_mpi(2, [WORKER, "fault", kind])
    assert run.returncode != 0
    assert run.ended_promptly_after_fault(), (run.fault_at, run.after_fault)
    assert "rank 0: finished" not in run.out


def test_an_uncaught_exception_in_one_rank_aborts_the_job():
    # without the hook the rank would wait in MPI_Finalize and the others in their allreduce, for ever
    from caffe.parallel.mpi_comm import EXIT_ABORT
    run = _mpi.run_mpi(2, [WORKER, "fault", "raise"])
    assert run.returncode == EXIT_ABORT and run.ended_promptly_after_fault(), (run.returncode, run.after_fault)
    err = run.err
    assert "RuntimeError: uncaught on rank 1" in err and "rank 1 of 2" in err and "uncaught RuntimeError" in err


def test_abort_waits_until_the_launcher_has_read_the_message():
    # MPI_Abort lets mpiexec kill the job at once, and hydra may then drop what still sits in a rank's pipes
    # (under load the message saying why was lost): abort first waits until its stderr pipe has been read
    import os
    import threading
    from caffe.parallel.mpi_comm import _unread_bytes, wait_until_output_read
    r, w = os.pipe()
    saved = os.dup(2)
    try:
        os.write(w, b"x" * 1000)
        assert _unread_bytes(w) == 1000
        os.dup2(w, 2)
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (wait_until_output_read(patience=600), done.set()), daemon=True)
        waiter.start()
        assert not done.wait(0.05)  # nobody has read the pipe: still waiting
        os.read(r, 400)
        assert not done.wait(0.05)  # read in part: still waiting
        os.read(r, 600)
        waiter.join(600)
        assert done.is_set() and _unread_bytes(w) == 0
        # a reader that stopped reading does not keep the process alive: it gives up after `patience`
        os.write(w, b"y" * 10)
        wait_until_output_read(patience=0.1)
        assert _unread_bytes(w) == 10
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(r)
        os.close(w)
