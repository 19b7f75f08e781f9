"""One training per snapshot_prefix: a lock, so two trainings cannot overwrite each other's snapshots.

A training (Solve, or the first Snapshot of a solver driven by step()) takes an exclusive
flock on `<dir>/.<base>.lock` for its snapshot_prefix `<dir>/<base>`. The kernel drops the
lock when the process ends however it ends (kill -9 included), so a lock is never stale;
the file is removed on release. A second training on the same prefix in another process
gets a SolverError naming the prefix and the process that holds it, unless it was asked to
overwrite (`caffe-cli train --overwrite_snapshots`, `solver.overwrite_snapshots = True`).
Solvers of one process share the lock (a script may build several on one prefix).

Taking the lock also cleans up after killed trainings: every `.<base>_iter_*` temporary
file whose writing process is gone is removed.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import threading

from caffe.blob.fileio import remove_stale_temps
from caffe.solver.params import SolverError

log = logging.getLogger("caffe.solver")

_lock = threading.Lock()
_held: dict[str, list] = {}  # lock path -> [fd, holders]; per process


def _split(prefix: str) -> tuple[str, str]:
    """(absolute directory, base) of the snapshot files `<prefix>_iter_N.*`: a prefix ending in a separator
    ("snapshots/") names files `_iter_N.*` inside that folder (abspath would drop the separator)."""
    directory, base = os.path.split(prefix)
    return os.path.abspath(directory or os.curdir), base


def lock_path(prefix: str) -> str:
    directory, base = _split(prefix)
    return os.path.join(directory, f".{base or 'snapshot'}.lock")


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(512).strip()
    except OSError:
        text = ""
    return text or "another process"


def _open_locked(path: str):
    """An fd holding the flock on `path`, or None when another process holds it."""
    import fcntl
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        # the holder before us may have removed the file between our open and our flock: retry on the new one
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def acquire(prefix: str) -> str:
    """Take (or share, within this process) the lock of `prefix`; returns the lock path."""
    path = lock_path(prefix)
    with _lock:
        entry = _held.get(path)
        if entry is not None:
            entry[1] += 1
            return path
        try:
            fd = _open_locked(path)
        except OSError as exc:
            raise SolverError(f"Cannot lock snapshot_prefix '{prefix}' ({path}): {exc.strerror or exc}. Make sure "
                              f"that the directory exists and is writable.") from None
        if fd is None:
            raise SolverError(
                f"snapshot_prefix '{prefix}' is in use by another training ({_holder(path)}; lock file {path}): "
                f"both would write {prefix}_iter_N.* and overwrite each other's snapshots. Give this training "
                f"another snapshot_prefix, wait for the other one to end, or pass --overwrite_snapshots "
                f"(solver.overwrite_snapshots = True) to write there anyway.")
        info = f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:300]}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        _held[path] = [fd, 1]
    directory, base = _split(prefix)
    for stale in remove_stale_temps(directory, f"{base}_iter_"):
        log.info("Removed %s, a temporary file left by an interrupted snapshot", stale)
    return path


def release(prefix: str) -> None:
    path = lock_path(prefix)
    with _lock:
        entry = _held.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[path]
        try:
            os.unlink(path)  # while still locked: a waiter that opened it re-opens the new file
        except OSError:
            pass
        os.close(entry[0])


def held_by_other(prefix: str) -> str | None:
    """Who holds the lock of `prefix` when another process does (for a warning); None otherwise."""
    path = lock_path(prefix)
    if path in _held or not os.path.exists(path):
        return None
    try:
        fd = _open_locked(path)
    except OSError:
        return None
    if fd is None:
        return _holder(path)
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)
    return None
