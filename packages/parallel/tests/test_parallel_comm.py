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


def test_hung_rank_is_stopped_by_the_timeout():
    from caffe.parallel.mpi_comm import EXIT_ABORT
    rc, out, err, secs = _mpi.run_mpi(2, [WORKER, "fault", "hang", "1.5"], timeout=60)
    assert rc == EXIT_ABORT, (rc, err)
    assert secs < 30
    assert "rank 0 of 2" in err and "allreduce at iteration 2 has waited" in err and "1.5 s timeout" in err
    assert "CAFFE_PARALLEL_TIMEOUT" in err


def test_dead_rank_is_named_when_the_launcher_does_not_clean_up():
    # mpiexec's own clean-up is off: only the watchdog stands between the other ranks and a hang
    from caffe.parallel.mpi_comm import EXIT_ABORT
    rc, out, err, secs = _mpi.run_mpi(3, [WORKER, "fault", "exit"], mpi_flags=["-disable-auto-cleanup"], timeout=60)
    assert rc == EXIT_ABORT, (rc, err)
    assert secs < 30
    assert "rank 1 (pid" in err and "exited while this rank waited in allreduce at iteration 2" in err


@pytest.mark.parametrize("kind", ["exit", "kill"])
def test_dead_rank_ends_the_job_with_default_launcher(kind):
    # MPICH's mpiexec stops the job itself when a rank dies: the job ends at once, never hangs
    rc, out, err, secs = _mpi.run_mpi(2, [WORKER, "fault", kind], timeout=60)
    assert rc != 0
    assert secs < 30
    assert "rank 0: finished" not in out


def test_an_uncaught_exception_in_one_rank_aborts_the_job():
    # without the hook the rank would wait in MPI_Finalize and the others in their allreduce, for ever
    from caffe.parallel.mpi_comm import EXIT_ABORT
    rc, out, err, secs = _mpi.run_mpi(2, [WORKER, "fault", "raise"], timeout=60)
    assert rc == EXIT_ABORT and secs < 30
    assert "RuntimeError: uncaught on rank 1" in err and "rank 1 of 2" in err and "uncaught RuntimeError" in err
