"""Run under mpiexec by test_parallel_comm.py: exercises MPICommunicator and its watchdog.

    mpiexec -n N python _mpi_comm_worker.py collectives
    mpiexec -n N python _mpi_comm_worker.py fault {hang,exit,kill,raise} [timeout]
"""
import os
import signal
import sys
import time

import numpy as np

from caffe.parallel.mpi_comm import MPICommunicator


def collectives():
    comm = MPICommunicator(timeout=60)
    r, n = comm.rank, comm.size
    for dtype in (np.float32, np.float64):
        for count in (1, 7, 1000, 100_003):
            rng = np.random.default_rng(1000 * count + r)
            mine = rng.standard_normal(count).astype(dtype)
            everyone = comm.allgather_object(mine)
            expect = np.sum(np.stack(everyone).astype(np.float64), axis=0)
            buf = mine.copy()
            comm.allreduce(buf)
            np.testing.assert_allclose(buf, expect, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
            # every rank holds the very same bits after an allreduce
            bits = comm.allgather_object(buf.tobytes())
            assert all(b == bits[0] for b in bits), "ranks disagree bitwise after allreduce"
            # non-blocking over disjoint slices of one buffer (the layer-wise reduce)
            buf2 = mine.copy()
            cuts = [0, count // 3, count // 2, count]
            reqs = [comm.iallreduce(buf2[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]
            comm.test(reqs)
            comm.wait(reqs)
            np.testing.assert_array_equal(buf2, buf)
            # broadcast from every root
            for root in range(n):
                b = mine.copy()
                comm.bcast(b, root=root)
                np.testing.assert_array_equal(b, everyone[root])
    try:
        comm.allreduce(np.ones((4, 4), np.float32)[:, ::2])
    except TypeError as exc:
        assert "C-contiguous" in str(exc)
    else:
        raise AssertionError("a strided buffer was accepted")
    assert comm.bcast_object("uid" if r == 0 else None) == "uid"
    comm.barrier()
    comm.close()
    print(f"rank {r} of {n}: collectives ok", flush=True)


def fault(kind, timeout):
    # the start-up runs under the default timeout; `timeout` applies once every rank reached the fault's
    # iteration, so a start-up slowed by the machine's load is never taken for a hang
    comm = MPICommunicator()
    buf = np.ones(1000, np.float32)
    for it in range(6):
        comm.where = f"iteration {it}"
        if it == 2:
            # handshake, point to point: rank 1 fails only once every other rank has left iteration 1's
            # allreduce, so their watchdogs report iteration 2 however late the scheduler lets them run
            if comm.rank == 1:
                for r in range(comm.size):
                    if r != 1:
                        comm.comm.recv(source=r, tag=17)
                print(f"rank 1: injects a fault ({kind}) at iteration 2", file=sys.stderr, flush=True)
            else:
                comm.comm.send(it, dest=1, tag=17)
            comm.set_timeout(float(timeout))
        if comm.rank == 1 and it == 2:
            if kind == "hang":
                time.sleep(600)
            elif kind == "exit":
                os._exit(1)
            elif kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif kind == "raise":
                raise RuntimeError("uncaught on rank 1")
        comm.allreduce(buf)
    print(f"rank {comm.rank}: finished", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "collectives":
        collectives()
    else:
        fault(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else 1800)
