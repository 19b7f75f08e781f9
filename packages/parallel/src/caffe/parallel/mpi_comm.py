"""MPI backend (mpi4py) for host buffers, with a watchdog that stops the job instead of hanging.

MPI collectives block until every rank arrives, so a rank that dies or hangs would leave the
others waiting forever. A daemon thread watches each blocking collective: when a peer process on
this machine has exited, or a collective has waited longer than the timeout (a hung rank, or a dead
one on another machine), it prints which rank and what happened and calls MPI_Abort, which ends the
whole job with a non-zero status. The timeout must exceed the longest legitimate wait, i.e. rank
0's test passes and snapshots, which the other ranks wait out inside the next collective.
"""
from __future__ import annotations

import array
import os
import stat
import sys
import threading
import time

import numpy as np

from caffe.parallel._extras import require_mpi
from caffe.parallel.comm import Communicator

TIMEOUT_ENV = "CAFFE_PARALLEL_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0  # seconds; rank 0 may test or snapshot for minutes while the others wait
EXIT_ABORT = 70  # the job's exit status after a watchdog or failure abort (EX_SOFTWARE)
_aborting = threading.Lock()  # one abort per process: the watchdog and the main thread may both try


def resolve_timeout(timeout: float | None = None) -> float | None:
    """The watchdog timeout in seconds: the argument, else $CAFFE_PARALLEL_TIMEOUT, else 1800; 0 disables."""
    if timeout is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds (0 disables the timeout)") from None
    timeout = float(timeout)
    if timeout < 0:
        raise ValueError(f"the collective timeout must be >= 0 seconds (0 disables it), got {timeout}")
    return timeout or None


def _process_alive(pid: int) -> bool:
    """False once `pid` has exited (a zombie not yet reaped by mpiexec counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: signal 0 tells whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _unread_bytes(fd: int) -> int:
    """Bytes written to `fd` (a pipe or socket) that its reader has not taken yet; 0 for files and terminals."""
    try:
        import fcntl
        import termios
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            request = termios.FIONREAD  # on Linux a pipe's write end also answers: bytes still in the pipe
        elif stat.S_ISSOCK(mode):
            request = termios.TIOCOUTQ  # bytes not yet sent
        else:
            return 0
        count = array.array("i", [0])
        fcntl.ioctl(fd, request, count, True)
        return int(count[0])
    except (ImportError, AttributeError, OSError, ValueError):
        return 0


def wait_until_output_read(patience: float = 5.0, poll: float = 0.005) -> None:
    """Wait until the launcher has read what this process printed to stdout and stderr.

    On MPI_Abort, mpiexec (hydra) kills every rank and exits, and it can do so before it has forwarded what
    still sits in the ranks' stdout/stderr pipes: under load the message saying why the job stopped was
    lost. Waits while the pipes keep draining; gives up once they have not drained for `patience` s (a
    reader that stopped reading must not keep the job alive)."""
    last, since = None, time.monotonic()
    while True:
        left = _unread_bytes(1) + _unread_bytes(2)
        if left == 0:
            return
        if last is None or left < last:
            last, since = left, time.monotonic()
        elif time.monotonic() - since > patience:
            return
        time.sleep(poll)


class Watchdog:
    """Aborts the MPI job when a blocking collective cannot finish (dead local peer or timeout)."""

    def __init__(self, comm: "MPICommunicator", peers: list[tuple[str, int]], timeout: float | None,
                 poll: float = 0.25):
        self.comm = comm
        host = peers[comm.rank][0]
        # only processes on this machine can be watched directly; the timeout covers the others
        self.local_peers = [(r, pid) for r, (h, pid) in enumerate(peers) if h == host and r != comm.rank]
        self.peers = peers
        self._poll = poll
        self.set_timeout(timeout)
        self._op: str | None = None
        self._since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="caffe-parallel-watchdog", daemon=True)
        self._thread.start()

    def set_timeout(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.poll = self._poll if timeout is None else max(0.01, min(self._poll, timeout / 4))

    def enter(self, op: str) -> None:
        self._op = op
        self._since = time.monotonic()

    def leave(self) -> None:
        self._since = None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            since, op = self._since, self._op
            if since is None:
                continue  # peers may finish and exit while we are not in a collective
            dead = [(r, pid) for r, pid in self.local_peers if not _process_alive(pid)]
            where = self.comm.where
            at = f" at {where}" if where else ""
            if dead:
                who = ", ".join(f"rank {r} (pid {pid} on {self.peers[r][0]})" for r, pid in dead)
                self.comm.abort(f"{who} exited while this rank waited in {op}{at}; the job cannot "
                                f"continue without it")
            waited = time.monotonic() - since
            if self.timeout is not None and waited > self.timeout:
                self.comm.abort(
                    f"{op}{at} has waited {waited:.1f} s, over the {self.timeout:g} s timeout "
                    f"(${TIMEOUT_ENV}): a rank hung, died on another machine, or is far slower than "
                    f"this one; raise ${TIMEOUT_ENV} if rank 0's test passes or snapshots take longer")


def _abort_on_uncaught_exception(comm: "MPICommunicator") -> None:
    """An exception that ends one rank's script would leave the others blocked in their next collective
    (and this rank in MPI_Finalize): print it, then abort the whole job (as `python -m mpi4py` does)."""
    previous = sys.excepthook
    if getattr(previous, "_caffe_parallel", False):
        return

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        comm.abort(f"uncaught {exc_type.__name__}: {exc}")

    hook._caffe_parallel = True
    sys.excepthook = hook


class _Guard:
    __slots__ = ("wd", "op")

    def __init__(self, wd, op):
        self.wd, self.op = wd, op

    def __enter__(self):
        if self.wd is not None:
            self.wd.enter(self.op)

    def __exit__(self, *exc):
        if self.wd is not None:
            self.wd.leave()


class MPICommunicator(Communicator):
    """Collectives over NumPy buffers through mpi4py (defaults to MPI.COMM_WORLD)."""

    array_module = "numpy"

    def __init__(self, comm=None, timeout: float | None = None, watchdog: bool = True):
        MPI = require_mpi("the MPI communicator")
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout = resolve_timeout(timeout)
        self.where = ""  # set by the reducer ("iteration 12") for the watchdog's messages
        self.host = MPI.Get_processor_name()
        self.peers = self.comm.allgather((self.host, os.getpid()))
        self.watchdog = Watchdog(self, self.peers, self.timeout) if (watchdog and self.size > 1) else None
        if self.size > 1:
            _abort_on_uncaught_exception(self)

    def set_timeout(self, timeout: float) -> None:
        """Change the watchdog's limit for the collectives from now on (seconds; 0 disables): e.g. a short one
        once every rank is past a start-up whose length varies with the machine's load."""
        self.timeout = resolve_timeout(float(timeout))
        if self.watchdog is not None:
            self.watchdog.set_timeout(self.timeout)

    def _guard(self, op: str) -> _Guard:
        return _Guard(self.watchdog, op)

    @staticmethod
    def _check(buf) -> None:
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous or not buf.flags.writeable:
            raise TypeError("MPI collectives need a writable, C-contiguous NumPy array")

    def allreduce(self, buf) -> None:
        self._check(buf)
        with self._guard("allreduce"):
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def iallreduce(self, buf):
        self._check(buf)
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def test(self, requests) -> bool:
        """Drive progress of outstanding requests without blocking (MPI progresses inside MPI calls)."""
        return bool(self.MPI.Request.Testall(requests)) if requests else True

    def wait(self, requests) -> None:
        if requests:
            with self._guard("layer-wise allreduce"):
                self.MPI.Request.Waitall(requests)

    def bcast(self, buf, root: int = 0) -> None:
        self._check(buf)
        with self._guard("broadcast"):
            self.comm.Bcast(buf, root=root)

    def barrier(self) -> None:
        with self._guard("barrier"):
            self.comm.Barrier()

    def bcast_object(self, obj, root: int = 0):
        with self._guard("broadcast"):
            return self.comm.bcast(obj, root=root)

    def allgather_object(self, obj) -> list:
        with self._guard("allgather"):
            return self.comm.allgather(obj)

    def abort(self, message: str, code: int = EXIT_ABORT) -> None:
        """Print why, then end every rank of the job (MPI_Abort); never returns."""
        if not _aborting.acquire(blocking=False):
            # another thread of this rank is already aborting (the watchdog, or the main thread's handler):
            # one message is enough; that thread ends the process
            while True:
                time.sleep(3600)
        text = (f"caffe.parallel: rank {self.rank} of {self.size} (pid {os.getpid()} on {self.host}): "
                f"{message}; stopping all ranks (MPI_Abort)\n")
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
            sys.stdout.flush()
            wait_until_output_read()
        finally:
            # should MPI_Abort itself hang, leave anyway: mpiexec then stops the other ranks
            fallback = threading.Timer(10.0, os._exit, (code,))
            fallback.daemon = True
            fallback.start()
            self.comm.Abort(code)
            # MPI_Abort can return once the process manager has the request (hydra under -disable-auto-cleanup):
            # the job is ending; wait here for mpiexec or the fallback (leaving at once cuts hydra off mid-reply)
            while True:
                time.sleep(3600)

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
