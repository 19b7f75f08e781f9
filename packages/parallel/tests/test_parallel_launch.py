"""Launch arguments and optional extras: --gpu ids, no GPU, mpiexec without mpi4py, the MPI world."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from caffe.blob import context
from caffe.blob.context import NoGPUError
from caffe.parallel import MissingExtraError, ParallelError, launch

_spec = importlib.util.spec_from_file_location("_parallel_mpi_helpers", Path(__file__).with_name("_mpi.py"))
_mpi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mpi)


@pytest.mark.parametrize("spec, count, expect", [
    ("0,1", 2, [0, 1]), ("1", 4, [1]), ("all", 3, [0, 1, 2]), (" 2, 0 ", 4, [2, 0]), ([3, 1], 4, [3, 1]), (0, 1, [0]),
])
def test_gpu_lists(spec, count, expect):
    assert launch.parse_gpu_list(spec, count) == expect


@pytest.mark.parametrize("spec, count, exc, match", [
    ("0,2", 2, NoGPUError, r"--gpu=0,2: GPU 2 does not exist \(2 GPU\(s\) visible: ids 0..1\)"),
    ([5], 4, NoGPUError, r"--gpu=5: GPU 5 does not exist"),
    ("0,0", 2, ValueError, r"--gpu=0,0: GPU 0 is listed twice"),
    ("a,b", 2, ValueError, r"--gpu=a,b: expected GPU ids separated by commas"),
    ("-1", 2, ValueError, r"GPU ids are >= 0"),
    ("", 2, ValueError, r"no GPU id given"),
])
def test_bad_gpu_lists(spec, count, exc, match):
    with pytest.raises(exc, match=match):
        launch.parse_gpu_list(spec, count)


@pytest.mark.skipif(context.gpu_available(), reason="checks the behaviour without a GPU")
def test_gpu_flags_without_a_gpu():
    with pytest.raises(NoGPUError, match=r"--gpu=0,1: a GPU was requested but none is usable"):
        launch.select_gpus("0,1")
    with pytest.raises(NoGPUError, match=r"--gpu=0: a GPU was requested"):
        launch.parse_gpu_list("0", 0)
    # nothing is spawned: the error comes first
    with pytest.raises(NoGPUError, match=r"--gpu=0,1"):
        launch.train_multi_gpu("no-such-solver.prototxt", "0,1")


@pytest.mark.gpu  # also under the CuPy stand-in, where cupy.cuda.nccl is already imported when cupy is hidden
def test_nccl_without_the_extra(monkeypatch):
    import caffe
    import caffe.parallel
    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    assert caffe.parallel.has_nccl() is False
    assert caffe.has_nccl() is False
    with pytest.raises(MissingExtraError, match=r"pip install 'caffe-parallel\[nccl\]'"):
        caffe.NCCL.new_uid()
    with pytest.raises(MissingExtraError, match=r"caffe.NCCL needs CuPy.*caffe-parallel\[nccl\]"):
        caffe.NCCL(object(), b"uid")


def test_mpi_world_outside_mpiexec(monkeypatch):
    for var in launch._SIZE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert launch.mpi_world() is None
    monkeypatch.setenv("PMI_SIZE", "1")
    assert launch.mpi_world() is None


def test_mpiexec_without_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if mpi4py were not installed
    with pytest.raises(MissingExtraError, match=r"one of 4 ranks.*needs mpi4py.*pip install 'caffe-parallel\[mpi\]'"):
        launch.mpi_world()


def test_mpi_world_under_mpiexec_and_without_mpi4py():
    code = ("import sys\n"
            "if sys.argv[1] == 'hide': sys.modules['mpi4py'] = None\n"
            "from caffe.parallel import launch, MissingExtraError\n"
            "try:\n"
            "    print(f'world {launch.mpi_world()}', flush=True)\n"
            "except MissingExtraError as exc:\n"
            "    print(f'MISSING {exc}', flush=True)\n")
    rc, out, err, _ = _mpi.run_mpi(2, ["-c", code, "show"])
    assert rc == 0, err
    # the ranks' output may arrive interleaved (one print is two writes when unbuffered): search all of it
    assert sorted(re.findall(r"world \((\d), 2, (\d)\)", out)) == [("0", "0"), ("1", "1")]
    rc, out, err, _ = _mpi.run_mpi(2, ["-c", code, "hide"])
    assert rc == 0, err
    assert out.count("MISSING") == 2 and out.count("pip install 'caffe-parallel[mpi]'") == 2


def test_reducer_refuses_unset_solver_coordinates():
    from caffe.parallel.reducer import GradientReducer

    class TwoRanks:
        rank, size = 1, 2

    assert context.solver_count() == 1
    with pytest.raises(ParallelError, match=r"call caffe.set_solver_count\(2\), caffe.set_solver_rank\(1\)"):
        GradientReducer(object(), TwoRanks())


def test_spawned_ranks_a_failure_stops_the_others():
    import os
    import time
    # rank 0 would sleep for 300 s: a call that returns sooner stopped it (a bound set by what the failure
    # would cost, not by a guess at how fast a loaded machine starts processes)
    sleep = 300
    t0 = time.monotonic()
    # rank 1 raises: the launcher stops rank 0 and names rank 1
    with pytest.raises(ParallelError, match=r"rank 1 \(GPU 5\) failed: ValueError: .*the other ranks were stopped"):
        launch.spawn_ranks(time.sleep, [(sleep,), (-1,)], labels=["rank 0 (GPU 4)", "rank 1 (GPU 5)"])
    assert time.monotonic() - t0 < sleep
    # a rank that dies without a Python error (a crash, the OOM killer)
    t0 = time.monotonic()
    with pytest.raises(ParallelError, match=r"rank 1 failed: its process ended with exit code 3 and no Python error"):
        launch.spawn_ranks([time.sleep, os._exit], [(sleep,), (3,)])
    assert time.monotonic() - t0 < sleep
    launch.spawn_ranks(time.sleep, [(0,), (0.1,)])  # all ranks succeed: returns
