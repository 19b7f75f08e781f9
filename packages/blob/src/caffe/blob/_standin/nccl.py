"""Stand-in for `cupy.cuda.nccl` with real multi-rank semantics.

Ranks may be threads of one process or separate processes (spawned, forked, under mpiexec): they meet
through a Unix socket named by the unique id, rank 0 in the middle. Every collective sends each rank's
device bytes to rank 0, which checks that all ranks called the same collective with the same count,
type, operation and root (a real NCCL would hang or corrupt memory), computes the result in rank
order and sends each rank its share. Calls block until every rank has made them; between
`groupStart()` and `groupEnd()` they are queued and run together at `groupEnd` (so one thread may drive
several communicators, as with `initAll`). Buffers are raw device pointers, checked to lie in the
stand-in's device memory of the communicator's device.
"""
from __future__ import annotations

import functools
import os
import secrets
import socket
import tempfile
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from caffe.blob._standin import _state
from caffe.blob._standin._memory import registry

available = True

NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4

_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16,
           7: np.float32, 8: np.float64}
_OPS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum, NCCL_AVG: np.add}
_MAGIC = b"CSTANDIN"
_UID_BYTES = 128


class NcclError(RuntimeError):
    def __init__(self, status: int, message: str = ""):
        self.status = status
        super().__init__(f"NCCL stand-in error {status}: {message}" if message else f"NCCL stand-in error {status}")


def get_version() -> int:
    return 22703


get_build_version = get_version


def get_unique_id() -> bytes:
    """128 bytes (CuPy >= 14 returns bytes; older CuPy returned a tuple of ints)."""
    return (_MAGIC + secrets.token_bytes(16)).ljust(_UID_BYTES, b"\0")


def _timeout() -> float:
    return float(os.environ.get("CAFFE_STANDIN_NCCL_TIMEOUT", "120"))


def _sock_path(uid: bytes) -> str:
    base = tempfile.gettempdir()
    path = os.path.join(base, f"cnccl-{uid[len(_MAGIC):len(_MAGIC) + 16].hex()}.sock")
    return path if len(path) < 100 else os.path.join("/tmp", os.path.basename(path))


# ------------------------------------------------------------------------------------------ groups

_group = threading.local()


def _pending():
    if not hasattr(_group, "depth"):
        _group.depth, _group.calls = 0, []
    return _group


def groupStart() -> None:
    _pending().depth += 1


def groupEnd() -> None:
    g = _pending()
    if g.depth == 0:
        raise NcclError(5, "groupEnd without groupStart")
    g.depth -= 1
    if g.depth:
        return
    calls, g.calls = g.calls, []
    _on_threads(calls)


def _on_threads(calls) -> None:
    """Run each callable on its own thread (ranks meet in their collectives), wait for all, re-raise the first
    error."""
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,), daemon=True) for fn in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------------------ communicator

class NcclCommunicator:
    """`NcclCommunicator(ndev, commId, rank)`: rank `rank` of `ndev`, on the current device."""

    def __init__(self, ndev: int, commId, rank: int):
        if not isinstance(commId, bytes) or len(commId) != _UID_BYTES:
            raise TypeError(f"NcclCommunicator: commId must be the {_UID_BYTES} bytes of nccl.get_unique_id() "
                            f"(CuPy >= 14), got {type(commId).__name__}")
        if not commId.startswith(_MAGIC):
            raise NcclError(4, "commId was not made by the stand-in's get_unique_id()")
        ndev, rank = int(ndev), int(rank)
        if ndev < 1 or not 0 <= rank < ndev:
            raise NcclError(4, f"invalid rank {rank} for {ndev} ranks")
        from caffe.blob._standin import runtime
        self._device = runtime.check_device(_state.current_device())
        self._size, self._rank = ndev, rank
        self._seq = 0
        self._lock = threading.Lock()
        self._peers: dict[int, Connection] = {}
        self._hub: Connection | None = None
        if ndev > 1:
            (self._accept if rank == 0 else self._connect)(_sock_path(commId))

    # -- rendezvous ---------------------------------------------------------------------------------
    def _accept(self, path: str) -> None:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            srv.bind(path)
        except OSError as exc:
            srv.close()
            raise NcclError(2, f"unique id already in use or socket unavailable ({path}: {exc})") from None
        try:
            srv.listen(self._size)
            deadline = time.monotonic() + _timeout()
            while len(self._peers) < self._size - 1:
                srv.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    sock, _ = srv.accept()
                except socket.timeout:
                    raise NcclError(6, f"rank 0 waited {_timeout():.0f}s for {self._size - 1 - len(self._peers)} "
                                       "rank(s) to join the communicator") from None
                sock.setblocking(True)
                conn = Connection(sock.detach())
                rank, size = conn.recv()
                if size != self._size or rank in self._peers or not 0 < rank < self._size:
                    conn.send(("error", f"rank {rank} of {size} cannot join a communicator of {self._size} ranks"))
                    conn.close()
                    continue
                self._peers[rank] = conn
            for conn in self._peers.values():
                conn.send(("joined", None))
        finally:
            srv.close()
            try:
                os.unlink(path)
            except OSError:
                pass

    def _connect(self, path: str) -> None:
        deadline = time.monotonic() + _timeout()
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise NcclError(6, f"rank {self._rank} found no rank 0 for {_timeout():.0f}s") from None
                time.sleep(0.01)
        self._hub = Connection(sock.detach())
        self._hub.send((self._rank, self._size))
        status, msg = self._recv(self._hub, "the communicator's start")
        if status != "joined":
            raise NcclError(4, msg)

    def _recv(self, conn: Connection, what: str):
        if not conn.poll(_timeout()):
            raise NcclError(6, f"rank {self._rank} waited {_timeout():.0f}s for the other ranks in {what}")
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise NcclError(6, f"rank {self._rank}: a peer left the communicator during {what}") from None

    # -- the collective engine ------------------------------------------------------------------------
    def _exchange(self, name: str, payload: bytes, count: int, dtype: int, op: int, root: int):
        key = (name, count, dtype, op, root)
        if self._size == 1:
            return _compute(name, [payload], count, dtype, op, root, 1)[0]
        with self._lock:
            self._seq += 1
            what = f"{name} #{self._seq}"
            if self._rank != 0:
                self._hub.send((key, payload))
                status, result = self._recv(self._hub, what)
                if status != "ok":
                    raise NcclError(5, result)
                return result
            payloads, mismatch = [payload], None
            for r in range(1, self._size):
                their_key, their_payload = self._recv(self._peers[r], what)
                payloads.append(their_payload)
                if their_key != key and mismatch is None:
                    mismatch = (f"ranks disagree at collective #{self._seq}: rank 0 called {_describe(key)}, "
                                f"rank {r} called {_describe(their_key)}")
            if mismatch is not None:
                for conn in self._peers.values():
                    conn.send(("error", mismatch))
                raise NcclError(5, mismatch)
            results = _compute(name, payloads, count, dtype, op, root, self._size)
            for r, conn in self._peers.items():
                conn.send(("ok", results[r]))
            return results[0]

    def _run(self, fn):
        if _pending().depth > 0:
            _pending().calls.append(fn)
        else:
            fn()

    def _bytes(self, ptr: int, count: int, dtype: int, what: str) -> np.ndarray:
        if dtype not in _DTYPES:
            raise NcclError(4, f"{what}: unsupported datatype {dtype}")
        nbytes = int(count) * np.dtype(_DTYPES[dtype]).itemsize
        view, device = registry.resolve(ptr, nbytes, f"nccl {what}")
        if device != self._device:
            raise NcclError(4, f"{what}: the buffer is on device {device} but this communicator is on device "
                               f"{self._device}")
        return view

    @staticmethod
    def _check_stream(stream) -> None:
        if not isinstance(stream, int):
            raise TypeError(f"stream must be a stream pointer (int, e.g. stream.ptr), got {type(stream).__name__}")

    def _checked(self, op: int) -> None:
        if self._size and (self._hub is None and not self._peers and self._size > 1):
            raise NcclError(5, "the communicator was destroyed")
        if op not in _OPS:
            raise NcclError(4, f"unsupported reduction op {op}")

    # -- collectives ----------------------------------------------------------------------------------
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:
        self._check_stream(stream)
        self._checked(op)

        def fn():
            data = self._bytes(sendbuf, count, datatype, "allReduce").tobytes()
            out = self._exchange("allReduce", data, count, datatype, op, -1)
            self._bytes(recvbuf, count, datatype, "allReduce")[...] = np.frombuffer(out, np.uint8)
        self._run(fn)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int, stream: int) -> None:
        self._check_stream(stream)
        self._checked(op)

        def fn():
            data = self._bytes(sendbuf, count, datatype, "reduce").tobytes()
            out = self._exchange("reduce", data, count, datatype, op, int(root))
            if self._rank == root:
                self._bytes(recvbuf, count, datatype, "reduce")[...] = np.frombuffer(out, np.uint8)
        self._run(fn)

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._check_stream(stream)

        def fn():
            data = self._bytes(sendbuf, count, datatype, "broadcast").tobytes() if self._rank == root else b""
            out = self._exchange("broadcast", data, count, datatype, NCCL_SUM, int(root))
            self._bytes(recvbuf, count, datatype, "broadcast")[...] = np.frombuffer(out, np.uint8)
        self._run(fn)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        self._check_stream(stream)

        def fn():
            data = self._bytes(sendbuf, count, datatype, "allGather").tobytes()
            out = self._exchange("allGather", data, count, datatype, NCCL_SUM, -1)
            self._bytes(recvbuf, count * self._size, datatype, "allGather")[...] = np.frombuffer(out, np.uint8)
        self._run(fn)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:
        self._check_stream(stream)
        self._checked(op)

        def fn():
            data = self._bytes(sendbuf, recvcount * self._size, datatype, "reduceScatter").tobytes()
            out = self._exchange("reduceScatter", data, recvcount, datatype, op, -1)
            self._bytes(recvbuf, recvcount, datatype, "reduceScatter")[...] = np.frombuffer(out, np.uint8)
        self._run(fn)

    # -- bookkeeping ----------------------------------------------------------------------------------
    def device_id(self) -> int:
        return self._device

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def check_async_error(self) -> None:
        pass

    def destroy(self) -> None:
        for conn in list(self._peers.values()) + ([self._hub] if self._hub is not None else []):
            try:
                conn.close()
            except OSError:
                pass
        self._peers, self._hub = {}, None

    abort = destroy

    @staticmethod
    def initAll(devices) -> list:
        """One communicator per device (an int n means devices 0..n-1), all in this process."""
        from caffe.blob._standin.cuda import Device
        devices = list(range(devices)) if isinstance(devices, int) else [int(d) for d in devices]
        uid = get_unique_id()
        comms: list = [None] * len(devices)

        def make(i, d):
            with Device(d):
                comms[i] = NcclCommunicator(len(devices), uid, i)

        _on_threads([functools.partial(make, i, d) for i, d in enumerate(devices)])
        return comms


def _describe(key) -> str:
    name, count, dtype, op, root = key
    extra = f", root {root}" if root >= 0 else ""
    return f"{name}(count {count}, datatype {dtype}, op {op}{extra})"


def _compute(name: str, payloads: list[bytes], count: int, dtype: int, op: int, root: int, n: int) -> list:
    dt = _DTYPES[dtype]
    if name in ("broadcast",):
        return [payloads[root]] * n
    if name == "allGather":
        return [b"".join(payloads)] * n
    arrays = [np.frombuffer(p, dt) for p in payloads]
    acc = arrays[0].copy()
    for a in arrays[1:]:
        _OPS[op](acc, a, out=acc)
    if op == NCCL_AVG:
        acc = (acc / n).astype(dt) if acc.dtype.kind == "f" else acc // n
    if name == "reduceScatter":
        return [acc[r * count:(r + 1) * count].tobytes() for r in range(n)]
    out = acc.tobytes()
    return [out] * n
