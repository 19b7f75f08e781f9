"""Files the framework reads and writes: bounded reads of regular files, and atomic writes.

Reading. Every loader (nets, weights, solvers, solver states, mean files, list files)
reads through `read_regular_file` / `read_text_file`: the path must name a regular file
(a FIFO, a device such as /dev/zero or a directory is refused before anything is read,
and opening never blocks), and no more is read than the file's own size, never more than
the format allows (`PROTO_LIMIT`: protobuf, and so Caffe, parse at most INT_MAX bytes).

Writing. Every file the framework writes goes through `atomic_path` / `atomic_open`: a
temporary file `.<name>.tmp-<pid>-<id>` beside the target, created with mode 0666 so the
umask applies as it does to any new file; on success it is fsynced, renamed over the
target and the directory is fsynced; on any failure it is removed and an OSError naming
the target (`WriteError`, errno kept: ENOSPC stays ENOSPC) is raised. A temporary left by
a process killed with SIGKILL is removed by the next write of the same target (or, for
snapshots, by the next training on the same snapshot_prefix) once its process is gone.

`reap_on_exit(path)` covers what a long-running writer leaves while it works (a database
being converted): a small watcher process removes the registered paths if this process
dies, even by SIGKILL, before `unreap(path)`.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import threading

# protobuf refuses messages of 2 GiB or more; Caffe's kProtoReadBytesLimit is INT_MAX as well
PROTO_LIMIT = 2**31 - 1
_CHUNK = 1 << 16


class FileInputError(ValueError):
    """A file that cannot be used as input (missing, not a regular file, too big, unreadable); names it."""

    def __init__(self, message: str, path: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.path = path
        self.reason = reason or message  # what is wrong, without the file's name (for callers' own wording)

    def __reduce__(self):
        return type(self), (str(self), self.path, self.reason)


class WriteError(OSError):
    """Writing a file failed (disk full, permissions, ...); the message names the target file.

    The errno of the underlying failure is kept (`exc.errno == errno.ENOSPC` on a full disk) and
    nothing is left under the target's name nor as a temporary file.
    """

    def __init__(self, errno_: int | None, message: str, path: str):
        super().__init__(errno_, message)
        self.filename = path
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.errno, self.message, self.filename)


# ----------------------------------------------------------------------------- reading

def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def format_bytes(n: int) -> str:
    """'6.1 GiB (6549913600 bytes)': a byte count as people read it, and exactly."""
    text = _size_text(int(n))
    return text if text.endswith("bytes") else f"{text} ({int(n)} bytes)"


def _error(verb: str, what: str, path: str, reason: str) -> FileInputError:
    return FileInputError(f"{verb} {what} '{path}': {reason}", path, reason)


def _open_error(exc: OSError, path: str, what: str) -> FileInputError:
    if isinstance(exc, FileNotFoundError):
        return _error("Cannot open", what, path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return _error("Cannot open", what, path, "it is a directory, not a file")
    if isinstance(exc, PermissionError):
        return _error("Cannot open", what, path, "permission denied")
    return _error("Cannot read", what, path, str(exc.strerror or exc))


def open_regular_file(path, what: str = "file"):
    """(binary file object, size) for a regular file; anything else is refused without blocking."""
    path = os.fspath(path)
    # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever; on a regular file it is a no-op
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _open_error(exc, path, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _error("Cannot read", what, path, f"it is {_kind(st.st_mode)}, not a regular file (only regular "
                         f"files are read, so an endless or blocking stream cannot hang or exhaust memory)")
        return os.fdopen(fd, "rb", buffering=0), int(st.st_size)
    except BaseException:
        os.close(fd)
        raise


def require_regular_file(path, what: str = "file") -> int:
    """Check that `path` is an existing regular file (without reading it); returns its size."""
    f, size = open_regular_file(path, what)
    f.close()
    return size


def read_regular_file(path, what: str = "file", limit: int = PROTO_LIMIT, fmt: str = "") -> bytes:
    """The bytes of a regular file, refused when it holds more than `limit` (what its format allows)."""
    path = os.fspath(path)
    f, size = open_regular_file(path, what)
    too_big = f"it is {{}}, more than the {format_bytes(limit)} {fmt or 'this kind of file'} can hold"
    with f:
        if size > limit:
            raise _error("Cannot read", what, path, too_big.format(format_bytes(size)))
        try:
            if size:
                data = f.read(size)  # a file growing meanwhile is read up to the size seen
            else:  # a regular file that reports no size (procfs): read in chunks, bounded
                parts, total = [], 0
                while True:
                    chunk = f.read(_CHUNK)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > limit:
                        raise _error("Cannot read", what, path, too_big.format(f"more than {format_bytes(limit)}"))
                    parts.append(chunk)
                data = b"".join(parts)
        except OSError as exc:
            raise _error("Cannot read", what, path, str(exc.strerror or exc)) from None
    return data


def read_text_file(path, what: str = "file", limit: int = PROTO_LIMIT, fmt: str = "") -> str:
    """A regular text file decoded as UTF-8; a binary file gets a clear error (not a decode traceback)."""
    data = read_regular_file(path, what, limit, fmt)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error("Cannot read", what, os.fspath(path), f"it is not a text file ({exc.reason} at byte "
                     f"{exc.start}); was a binary file given where a text one belongs?") from None


# ----------------------------------------------------------------------------- writing

_TMP_RE = re.compile(r"^\.(?P<base>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")


def temp_name(path: str) -> str:
    """The temporary name an atomic write of `path` uses: .<name>.tmp-<pid>-<8 hex> beside it."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_stale_temps(directory: str, base_prefix: str, *, any_pid: bool = False) -> list[str]:
    """Remove atomic-write temporaries in `directory` whose target name starts with `base_prefix` and
    whose writer is gone (any writer but this process with `any_pid`, when the caller owns the names,
    e.g. under the snapshot_prefix lock). Returns the removed paths."""
    removed = []
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return removed
    for name in names:
        m = _TMP_RE.match(name)
        if not m or not m.group("base").startswith(base_prefix):
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or (not any_pid and pid_alive(pid)):
            continue
        full = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
    return removed


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str) -> None:
    """Make a rename in `directory` durable; not every platform can open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_error(exc: OSError, path: str, what: str) -> WriteError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    hint = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return WriteError(exc.errno, f"Cannot write {what} '{path}': {reason}{hint}; nothing was written under "
                                 f"that name", path)


@contextlib.contextmanager
def atomic_path(path, what: str = "file"):
    """Yield a temporary path beside `path`; when the block succeeds it replaces `path` atomically."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temps(directory, os.path.basename(path))
    tmp = temp_name(path)
    try:
        # mode 0666: the kernel applies the umask, so the file gets the mode any new file would
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        os.close(fd)
    except OSError as exc:
        raise write_error(exc, path, what) from None
    try:
        yield tmp
        _fsync_path(tmp)
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_error(exc, path, what) from exc
        raise


@contextlib.contextmanager
def atomic_open(path, what: str = "file"):
    """A binary file object whose content replaces `path` atomically when the block succeeds."""
    with atomic_path(path, what) as tmp:
        with open(tmp, "wb") as f:
            yield f
            f.flush()


def atomic_write_bytes(path, data, what: str = "file") -> None:
    """Write `data` (bytes) to `path` atomically."""
    with atomic_open(path, what) as f:
        f.write(data)


# ----------------------------------------------------------------------------- the reaper

# Runs with -S -I (no site, no user paths): stdlib only. Reads "+<hex path>" / "-<hex path>" lines until
# EOF, which comes when every holder of the pipe (this process) is gone, however it ended.
_REAPER = r"""
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
paths = set()
for line in sys.stdin.buffer:
    line = line.strip()
    if not line:
        continue
    path = os.fsdecode(bytes.fromhex(line[1:].decode("ascii")))
    if line[:1] == b"+":
        paths.add(path)
    else:
        paths.discard(path)
for path in paths:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass
"""

_reaper_lock = threading.Lock()
_reaper: dict = {}  # pid -> Popen: a forked child starts its own


def _reaper_pipe():
    proc = _reaper.get(os.getpid())
    if proc is not None and proc.poll() is None:
        return proc.stdin
    try:
        proc = subprocess.Popen([sys.executable, "-S", "-I", "-c", _REAPER], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)
    except OSError:
        return None
    _reaper[os.getpid()] = proc
    if len(_reaper) == 1:
        atexit.register(_close_reaper)
    return proc.stdin


def _close_reaper() -> None:
    """At a normal exit: EOF to the watcher (it removes what is still registered) and reap it."""
    proc = _reaper.pop(os.getpid(), None)
    if proc is None:
        return
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _tell_reaper(op: bytes, path: str) -> bool:
    with _reaper_lock:
        pipe = _reaper_pipe()
        if pipe is None:
            return False
        try:
            pipe.write(op + os.fsencode(os.path.abspath(path)).hex().encode("ascii") + b"\n")
            pipe.flush()
        except (OSError, ValueError):
            return False
    return True


def reap_on_exit(path: str) -> bool:
    """Have `path` (a file or folder) removed if this process dies before `unreap(path)`; True when a
    watcher process took it (False where none can run: the next writer's stale cleanup still applies)."""
    return _tell_reaper(b"+", path)


def unreap(path: str) -> None:
    """`path` is finished (renamed into place or removed): the watcher forgets it."""
    if _reaper.get(os.getpid()) is not None:
        _tell_reaper(b"-", path)


__all__ = ["PROTO_LIMIT", "FileInputError", "WriteError", "open_regular_file", "require_regular_file",
           "read_regular_file", "read_text_file", "atomic_path", "atomic_open", "atomic_write_bytes",
           "remove_stale_temps", "temp_name", "fsync_dir", "pid_alive", "reap_on_exit", "unreap",
           "format_bytes", "write_error"]
