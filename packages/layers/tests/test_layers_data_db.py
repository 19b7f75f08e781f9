"""caffe.layers.db: LMDB/LevelDB reading in key order, atomic batched writing, clear errors."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from caffe.layers import db


def _records(n):
    return [(f"{i:08d}", f"value-{i}".encode()) for i in range(n)]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_round_trip_in_key_order(tmp_path, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    recs = _records(2500)
    shuffled = recs[1::2] + recs[::2]  # written out of order: the cursor still walks key order
    path = str(tmp_path / "out_db")
    assert db.write_db(path, shuffled, backend) == 2500
    with db.open_db(path, backend) as d:
        assert [(k.decode(), v) for k, v in d.items()] == recs
        cur = d.new_cursor()
        for _ in range(2500):
            cur.next()
        assert not cur.valid()
        cur.seek_to_first()
        assert cur.valid() and cur.key() == b"00000000"
    assert os.listdir(tmp_path) == ["out_db"]  # no temporary folder left


def test_backend_names():
    assert db.backend_name(1) == "lmdb" and db.backend_name(0) == "leveldb"
    assert db.backend_name("LMDB") == "lmdb"
    with pytest.raises(db.DBError, match="unknown database backend 'rocksdb'"):
        db.backend_name("rocksdb")


def test_missing_empty_and_wrong_kind_are_named(tmp_path):
    with pytest.raises(db.DBError, match="LMDB database '.*nowhere' does not exist"):
        db.open_db(str(tmp_path / "nowhere"), "lmdb")
    empty = str(tmp_path / "empty_lmdb")
    db.write_db(empty, [], "lmdb")
    with pytest.raises(db.DBError, match="LMDB database '.*empty_lmdb' holds no records"):
        db.open_db(empty, "lmdb")
    assert db.open_db(empty, "lmdb", require_records=False).count() == 0
    (tmp_path / "plain").mkdir()
    with pytest.raises(db.DBError, match="'.*plain' is not an LMDB database: it has no data.mdb"):
        db.open_db(str(tmp_path / "plain"), "lmdb")
    (tmp_path / "f").write_text("x")
    with pytest.raises(db.DBError, match="is not a folder"):
        db.open_db(str(tmp_path / "f"), "lmdb")


def test_leveldb_passed_as_lmdb_gets_a_hint(tmp_path):
    pytest.importorskip("plyvel", reason="LevelDB needs the optional plyvel package")
    path = str(tmp_path / "ldb")
    db.write_db(path, _records(3), "leveldb")
    with pytest.raises(db.DBError, match="looks like a LevelDB database: set backend: LEVELDB"):
        db.open_db(path, "lmdb")


def test_leveldb_without_plyvel_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plyvel", None)  # import plyvel -> ImportError
    with pytest.raises(db.DBError, match=r"plyvel package: pip install 'caffe-layers\[leveldb\]'"):
        db.DBWriter(str(tmp_path / "x"), "leveldb")
    assert os.listdir(tmp_path) == []


def test_existing_target_and_missing_parent_refused(tmp_path):
    path = str(tmp_path / "db")
    db.write_db(path, _records(2))
    with pytest.raises(db.DBError, match="output database '.*db' already exists"):
        db.DBWriter(path)
    with pytest.raises(db.DBError, match="its folder '.*missing' does not exist"):
        db.DBWriter(str(tmp_path / "missing" / "db"))


def test_writer_error_midway_leaves_nothing(tmp_path):
    path = str(tmp_path / "half_db")

    def records():
        yield from _records(2500)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        db.write_db(path, records(), batch=1000)  # two commits done before the failure
    assert os.listdir(tmp_path) == []


def test_commits_every_batch_and_grows_the_map(tmp_path, monkeypatch):
    monkeypatch.setattr(db, "_INITIAL_MAP_SIZE", 1 << 16)  # tiny map: must double several times
    path = str(tmp_path / "big_db")
    w = db.DBWriter(path, "lmdb", batch=100)
    commits = []
    real = w.commit
    monkeypatch.setattr(w, "commit", lambda: (commits.append(len(w._pending)), real()))
    for i in range(1050):
        w.put(f"{i:08d}", os.urandom(500))
    w.close()
    assert commits[:10] == [100] * 10 and commits[-1] == 50
    with db.open_db(path) as d:
        assert d.count() == 1050


_SLOW_WRITER = textwrap.dedent("""
    import signal, sys, time
    from caffe.layers import db
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
    with db.DBWriter(sys.argv[1], "lmdb", batch=10) as w:
        for i in range(100000):
            w.put("%08d" % i, b"x" * 100)
            if i == 50:
                print("writing", flush=True)
            if i >= 50:
                time.sleep(0.01)
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_killed_writer_leaves_no_database(tmp_path, sig):
    import signal
    target = tmp_path / "killed_db"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not target.exists()
    if sig == "SIGTERM":
        assert os.listdir(tmp_path) == []  # cleaned up on the way out
    else:  # SIGKILL cannot clean up: the watcher process (fileio.reap_on_exit) removes the partial folder
        end = time.monotonic() + 60
        while os.listdir(tmp_path) and time.monotonic() < end:
            time.sleep(0.05)
        assert os.listdir(tmp_path) == []


def test_next_writer_removes_a_dead_writers_partial_folder(tmp_path):
    """Where no watcher could run, the next writer of the target removes what a dead writer left."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".killed_db.partial-{dead}-0123abcd").mkdir()
    (tmp_path / f".killed_db.partial-{os.getppid()}-0123abcd").mkdir()  # a live writer's: kept
    db.write_db(str(tmp_path / "killed_db"), _records(3))
    assert sorted(os.listdir(tmp_path)) == [f".killed_db.partial-{os.getppid()}-0123abcd", "killed_db"]


def test_lmdb_read_as_leveldb_gets_a_hint(tmp_path, monkeypatch):
    """DataParameter's default backend is LEVELDB: an LMDB read without `backend: LMDB` says so."""
    path = str(tmp_path / "l")
    db.write_db(path, _records(1), "lmdb")
    monkeypatch.setitem(sys.modules, "plyvel", None)
    with pytest.raises(db.DBError, match="not a LevelDB database.*looks like an LMDB database: set backend: LMDB"):
        db.open_db(path, "leveldb")


def test_dropped_readers_release_the_environment(tmp_path):
    """A database rebuilt at the same path after its readers are gone is read afresh (no stale handle)."""
    import gc
    path = str(tmp_path / "db")
    db.write_db(path, [("a", b"old")])
    reader = db.open_db(path)
    assert list(reader.items()) == [(b"a", b"old")]
    del reader
    gc.collect()
    import shutil
    shutil.rmtree(path)
    db.write_db(path, [("a", b"new"), ("b", b"2")])
    with db.open_db(path) as d:
        assert list(d.items()) == [(b"a", b"new"), (b"b", b"2")]
    assert all(key[1] != os.path.realpath(path) for key in db._SharedLMDB._envs)
