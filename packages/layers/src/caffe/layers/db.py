"""Key-value databases of serialized records: LMDB and LevelDB (Caffe's caffe/util/db*.cpp).

Reading: `open_db(path, backend)` gives a DB whose cursor walks the records in key
order (bytewise, as Caffe's cursors do) and can wrap around with `seek_to_first`.
LMDB is opened read-only with `lock=False`, so many reader processes can share one
database; open it in the process (after fork) and thread that reads. LMDB maps the file:
a page past the end of a truncated data.mdb would kill the process with SIGBUS, so the
meta pages are checked against the file's size first (`check_lmdb_file`), and an LMDB
error while reading (MDB_CORRUPTED, ...) becomes a DBError naming the database.

Writing: `DBWriter(path, backend)` batches puts into transactions (one commit per
`batch` records; a commit per record would fsync each) and is atomic from the
user's view: it builds the database in a hidden temporary folder beside the target
and renames it into place on success. An error, Ctrl-C or SIGTERM (handled by the
CLI) removes the temporary folder; so does a watcher process if the writer is killed
with SIGKILL (caffe.blob.fileio.reap_on_exit), and, where no watcher could run, the
next writer of the same target. So a reader never sees a half-written database and
none is left behind.

LevelDB needs the optional `plyvel` package (`pip install caffe-layers[leveldb]`).
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import threading
import uuid

from caffe.blob.fileio import FileInputError, format_bytes, open_regular_file, reap_on_exit, unreap

LMDB = "lmdb"
LEVELDB = "leveldb"

# LMDB's map is address space, not disk: data.mdb grows with the data. Start small
# and double on MapFullError (Caffe's LMDBTransaction::DoubleMapSize).
_INITIAL_MAP_SIZE = 1 << 28


class DBError(RuntimeError):
    """A database is missing, empty, malformed, or cannot be written; the message names it."""


def backend_name(backend) -> str:
    """'lmdb' or 'leveldb' from a string (any case) or DataParameter.DB value (LEVELDB=0, LMDB=1)."""
    if isinstance(backend, str):
        name = backend.strip().lower()
        if name in (LMDB, LEVELDB):
            return name
        raise DBError(f"unknown database backend {backend!r}: expected 'lmdb' or 'leveldb'")
    if backend == 1:
        return LMDB
    if backend == 0:
        return LEVELDB
    raise DBError(f"unknown database backend {backend!r}: expected LMDB (1) or LEVELDB (0)")


def _plyvel():
    try:
        import plyvel
    except ImportError:
        raise DBError("the LevelDB backend needs the plyvel package: "
                      "pip install 'caffe-layers[leveldb]' (or use backend LMDB)") from None
    return plyvel


def _describe_folder(path: str) -> str:
    """A hint about what a folder holds when it is not the database we expected."""
    if not os.path.isdir(path):
        return ""
    names = set(os.listdir(path))
    if "data.mdb" in names:
        return " (it looks like an LMDB database: set backend: LMDB / -backend lmdb)"
    if "CURRENT" in names or any(n.endswith(".ldb") for n in names):
        return " (it looks like a LevelDB database: set backend: LEVELDB / -backend leveldb)"
    return ""


# ----------------------------------------------------------------------------- reading

class Cursor:
    """Caffe's db::Cursor: seek_to_first, next, key, value, valid."""

    def seek_to_first(self) -> None:
        raise NotImplementedError

    def next(self) -> None:
        raise NotImplementedError

    def key(self) -> bytes:
        raise NotImplementedError

    def value(self) -> bytes:
        raise NotImplementedError

    def valid(self) -> bool:
        raise NotImplementedError

    # Caffe's names call the subclass's method (a class alias here would bind the base's NotImplementedError)
    def SeekToFirst(self) -> None:
        self.seek_to_first()

    def Next(self) -> None:
        self.next()

    def Valid(self) -> bool:
        return self.valid()


class _LMDBCursor(Cursor):
    def __init__(self, env, path: str = "?"):
        self._path = path
        self._txn = self._cur = None
        self._last_key = b""
        with self._errors("opening a cursor on"):
            self._txn = env.begin(write=False, buffers=False)
            self._cur = self._txn.cursor()
            self._valid = self._cur.first()

    def _errors(self, doing: str):
        return _lmdb_errors(self._path, doing, self)

    def seek_to_first(self):
        with self._errors("going back to the first record of"):
            self._valid = self._cur.first()

    def next(self):
        with self._errors("moving to the next record of"):
            self._valid = self._cur.next()

    def key(self):
        with self._errors("reading a key of"):
            self._last_key = key = self._cur.key()
            return key

    def value(self):
        with self._errors("reading a record of"):
            return self._cur.value()

    def valid(self):
        return self._valid

    def close(self):
        if self._cur is not None:
            self._cur.close()
        if self._txn is not None:
            self._txn.abort()


class _lmdb_errors:
    """Turn an LMDB error (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, ...) into a DBError naming the database."""

    def __init__(self, path: str, doing: str, cursor=None):
        self.path, self.doing, self.cursor = path, doing, cursor

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            return False
        import lmdb
        if not issubclass(exc_type, lmdb.Error):
            return False
        after = ""
        key = getattr(self.cursor, "_last_key", b"")
        if key:
            after = f" (after key {key[:64]!r})"
        raise DBError(f"LMDB database '{self.path}' is corrupt or unreadable: {exc} while {self.doing} the "
                      f"database{after}; recreate it (or copy it again)") from None


class _LevelDBCursor(Cursor):
    def __init__(self, db):
        self._it = db.raw_iterator()
        self._it.seek_to_first()

    def seek_to_first(self):
        self._it.seek_to_first()

    def next(self):
        self._it.next()

    def key(self):
        return self._it.key()

    def value(self):
        return self._it.value()

    def valid(self):
        return self._it.valid()

    def close(self):
        self._it.close()


class _SharedLMDB:
    """One read-only Environment per database and process, shared by its readers.

    LMDB forbids opening one environment twice in a process (py-lmdb refuses), yet a
    process may hold several readers of one database: train and test nets on the same
    source, or data-parallel solvers in threads. Read transactions are per cursor
    (py-lmdb sets MDB_NOTLS), so sharing the Environment between threads is safe.
    Entries are per process id: a forked child opens its own (never the parent's).
    """
    _lock = threading.RLock()  # re-entrant: a GC-run __del__ inside acquire() takes it too
    _envs: dict = {}

    @classmethod
    def acquire(cls, path: str):
        import lmdb
        key = (os.getpid(), os.path.realpath(path))
        with cls._lock:
            entry = cls._envs.get(key)
            if entry is None:
                # readonly + lock=False: no lock-file writes; many reader processes (Caffe: MDB_RDONLY).
                env = lmdb.open(path, readonly=True, lock=False, subdir=True, readahead=False,
                                max_readers=1024)
                entry = cls._envs[key] = [env, 0]
            entry[1] += 1
            return entry[0]

    @classmethod
    def release(cls, env) -> None:
        with cls._lock:
            for key, entry in list(cls._envs.items()):
                if entry[0] is env and key[0] == os.getpid():
                    entry[1] -= 1
                    if entry[1] == 0:
                        del cls._envs[key]
                        env.close()
                    return


# LMDB 0.9 on a 64-bit little-endian machine: each of the first two pages holds a meta record after the
# 16-byte page header: magic, version, address, mapsize, two MDB_db records (48 bytes each; the free
# list's md_pad holds the page size), the last page used and the transaction id.
_LMDB_MAGIC, _LMDB_VERSION = 0xBEEFC0DE, 1
_META = struct.Struct("<II8xQI44xI44xQQ")  # magic, version, mapsize, psize, (main db md_pad), last_pg, txnid
_META_OFFSET = 16


def check_lmdb_file(path: str) -> None:
    """Refuse an LMDB whose data.mdb is shorter than its own meta pages say (a truncated copy): LMDB
    maps the file and reading a page past its end kills the process with SIGBUS, with no message."""
    data_path = os.path.join(path, "data.mdb")
    try:
        f, size = open_regular_file(data_path, "LMDB data file")
    except FileInputError as exc:
        raise DBError(f"LMDB database '{path}': {exc}") from None
    with f:
        head = f.read(min(size, _META_OFFSET + _META.size))
        metas = []
        if len(head) == _META_OFFSET + _META.size:
            metas.append(_META.unpack_from(head, _META_OFFSET))
            psize = metas[0][3]
            if metas[0][0] == _LMDB_MAGIC and 512 <= psize <= 65536 and psize & (psize - 1) == 0:
                f.seek(psize)
                second = f.read(_META_OFFSET + _META.size)
                if len(second) == _META_OFFSET + _META.size:
                    metas.append(_META.unpack_from(second, _META_OFFSET))
    where = f"LMDB database '{path}' ({data_path}, {format_bytes(size)})"
    if not metas or metas[0][0] != _LMDB_MAGIC:
        raise DBError(f"{where} is not an LMDB data file of this machine (no LMDB meta page at its start: "
                      f"the file is damaged, or was written on a platform with another word size)")
    magic, version, _, psize, _, _, _ = metas[0]
    if version != _LMDB_VERSION:
        raise DBError(f"{where} has LMDB data format version {version}; this LMDB reads version {_LMDB_VERSION}")
    if not (512 <= psize <= 65536 and psize & (psize - 1) == 0):
        raise DBError(f"{where} is corrupt: its meta page gives a page size of {psize}")
    if len(metas) < 2:
        raise DBError(f"{where} is truncated: it ends inside its second meta page (page size {psize})")
    # LMDB uses the meta page with the newer transaction (mdb_env_pick_meta)
    meta = metas[1] if metas[1][0] == _LMDB_MAGIC and metas[1][6] > metas[0][6] else metas[0]
    last_pg = meta[5]
    if last_pg >= (1 << 48):
        raise DBError(f"{where} is corrupt: its meta page names page {last_pg} as the last one")
    need = (last_pg + 1) * psize
    if size < need:
        raise DBError(f"{where} is truncated: its last page ({last_pg}, of {psize} bytes) ends at byte "
                      f"{need}, but the file holds only {size} bytes; it was cut short (an unfinished copy "
                      f"or download, or a full disk): copy or create it again")


class DB:
    """A database opened for reading. Use `open_db`."""

    def __init__(self, path: str, backend: str):
        self.path = path
        self.backend = backend
        self._handle = None
        self._cursors: list = []

    def new_cursor(self) -> Cursor:
        cur = _LMDBCursor(self._handle, self.path) if self.backend == LMDB else _LevelDBCursor(self._handle)
        self._cursors.append(cur)
        return cur

    NewCursor = new_cursor

    def count(self) -> int | None:
        """Number of records (LMDB knows it; LevelDB does not without a scan: None)."""
        if self.backend == LMDB:
            with _lmdb_errors(self.path, "counting the records of"):
                return int(self._handle.stat()["entries"])
        return None

    def is_empty(self) -> bool:
        cur = self.new_cursor()
        try:
            return not cur.valid()
        finally:
            cur.close()
            self._cursors.remove(cur)

    def items(self):
        """Every (key, value) in key order, once."""
        cur = self.new_cursor()
        try:
            while cur.valid():
                yield cur.key(), cur.value()
                cur.next()
        finally:
            cur.close()
            if cur in self._cursors:
                self._cursors.remove(cur)

    def close(self) -> None:
        for cur in self._cursors:
            try:
                cur.close()
            except Exception:
                pass
        self._cursors.clear()
        if self._handle is not None:
            if self.backend == LMDB:
                _SharedLMDB.release(self._handle)
            else:
                self._handle.close()
            self._handle = None

    Close = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A reader dropped without close() (e.g. with its layer) must still release the shared environment.
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return f"<DB {self.backend} {self.path!r}>"


def open_db(path: str, backend=LMDB, require_records: bool = True) -> DB:
    """Open an existing database read-only. Missing, unreadable or (by default) empty ones raise DBError."""
    backend = backend_name(backend)
    kind = "LMDB" if backend == LMDB else "LevelDB"
    if not path:
        raise DBError(f"no {kind} database path given")
    if not os.path.exists(path):
        raise DBError(f"{kind} database '{path}' does not exist")
    if not os.path.isdir(path):
        raise DBError(f"{kind} database '{path}' is not a folder (Caffe's databases are folders)")
    db = DB(path, backend)
    if backend == LMDB:
        import lmdb
        if not os.path.exists(os.path.join(path, "data.mdb")):
            raise DBError(f"'{path}' is not an LMDB database: it has no data.mdb{_describe_folder(path)}")
        check_lmdb_file(path)
        try:
            db._handle = _SharedLMDB.acquire(path)
        except lmdb.Error as exc:
            raise DBError(f"cannot open LMDB database '{path}': {exc}") from None
    else:
        if not os.path.exists(os.path.join(path, "CURRENT")):
            raise DBError(f"'{path}' is not a LevelDB database: it has no CURRENT file{_describe_folder(path)}")
        plyvel = _plyvel()
        try:
            db._handle = plyvel.DB(path, create_if_missing=False, max_open_files=100)
        except Exception as exc:  # plyvel.Error, IOError (lock held by another process)
            raise DBError(f"cannot open LevelDB database '{path}': {exc}") from None
    if require_records and db.is_empty():
        db.close()
        raise DBError(f"{kind} database '{path}' holds no records")
    return db


# ----------------------------------------------------------------------------- writing

_PARTIAL_RE = re.compile(r"^\.(?P<base>.+)\.partial-(?P<pid>\d+)-[0-9a-f]{8}$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_partials(parent: str, base: str) -> None:
    """Remove temporary folders of earlier writers of the same target whose process is gone (SIGKILL)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = _PARTIAL_RE.match(name)
        if m and m.group("base") == base and not _pid_alive(int(m.group("pid"))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


class DBWriter:
    """Write a new database atomically, committing every `batch` records.

        with DBWriter("examples/mnist/mnist_train_lmdb", "lmdb") as w:
            w.put(b"00000000", datum.SerializeToString())

    The target must not exist yet (as Caffe's tools, which mkdir it). Records go to a
    hidden folder `.<name>.partial-<pid>-<id>` beside it, renamed to the target by
    `close()`. `abort()` (and any exception inside the `with`) removes that folder.
    """

    def __init__(self, path: str, backend=LMDB, batch: int = 1000):
        self.backend = backend_name(backend)
        if not path:
            raise DBError("no output database path given")
        self.path = os.path.abspath(path)
        self.batch = max(1, int(batch))
        if os.path.exists(self.path):
            raise DBError(f"output database '{path}' already exists: remove it or choose another name")
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise DBError(f"cannot create database '{path}': its folder '{parent}' does not exist")
        base = os.path.basename(self.path)
        _remove_stale_partials(parent, base)
        self.tmp_path = os.path.join(parent, f".{base}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.mkdir(self.tmp_path)
        reap_on_exit(self.tmp_path)  # removed by a watcher even if this process is killed with SIGKILL
        self.count = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._closed = False
        try:
            if self.backend == LMDB:
                import lmdb
                self._env = lmdb.open(self.tmp_path, map_size=_INITIAL_MAP_SIZE, subdir=True,
                                      meminit=False, max_dbs=0)
            else:
                plyvel = _plyvel()
                # Caffe's LevelDB options: write_buffer_size 256 MB, max_open_files 100.
                self._env = plyvel.DB(self.tmp_path, create_if_missing=True, error_if_exists=False,
                                      write_buffer_size=268435456, max_open_files=100)
        except BaseException:
            shutil.rmtree(self.tmp_path, ignore_errors=True)
            unreap(self.tmp_path)
            raise

    def put(self, key, value: bytes) -> None:
        if self._closed:
            raise DBError(f"database '{self.path}' is already closed")
        if isinstance(key, str):
            key = key.encode("ascii")
        self._pending.append((key, value))
        self.count += 1
        if len(self._pending) >= self.batch:
            self.commit()

    Put = put

    def commit(self) -> None:
        """Write the pending records in one transaction."""
        if not self._pending:
            return
        if self.backend == LMDB:
            import lmdb
            while True:
                try:
                    with self._env.begin(write=True) as txn:
                        for k, v in self._pending:
                            txn.put(k, v)
                    break
                except lmdb.MapFullError:
                    # The aborted transaction wrote nothing: grow the map and retry the batch.
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)
        else:
            with self._env.write_batch() as wb:
                for k, v in self._pending:
                    wb.put(k, v)
        self._pending.clear()

    Commit = commit

    def close(self) -> str:
        """Commit what is pending and move the database into place; returns its path."""
        if self._closed:
            return self.path
        try:
            self.commit()
            if self.backend == LMDB:
                self._env.sync(True)
            self._env.close()
            self._closed = True
            os.rename(self.tmp_path, self.path)
        except BaseException:
            self.abort()
            raise
        unreap(self.tmp_path)
        return self.path

    def abort(self) -> None:
        """Drop everything written so far (the target is never created)."""
        if not self._closed:
            self._closed = True
            try:
                self._env.close()
            except Exception:
                pass
        self._pending.clear()
        shutil.rmtree(self.tmp_path, ignore_errors=True)
        unreap(self.tmp_path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self):
        # An abandoned writer (never closed) must not leave its partial folder behind.
        if not getattr(self, "_closed", True):
            try:
                self.abort()
            except Exception:
                pass


def write_db(path: str, records, backend=LMDB, batch: int = 1000) -> int:
    """Write (key, value) pairs (keys str or bytes) to a new database atomically; returns the count."""
    with DBWriter(path, backend, batch) as w:
        for key, value in records:
            w.put(key, value)
        return w.count
