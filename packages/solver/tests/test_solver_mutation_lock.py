"""caffe.solver.snapshot_lock's failure paths, which the mutation run of the hardened solver showed untested: a
prefix in a missing directory, a lock file another process holds without saying who, a leftover lock file of
a killed training, a lock file replaced between open and flock, flock errors other than "held", a lock file
already gone at release, and the per-process sharing count. The other process is a bare Python that holds a
flock (no caffe import: fast)."""
import errno
import fcntl
import gc
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from caffe.blob.fileio import temp_name
from caffe.solver import SolverError, snapshot_lock


def hold(path, text=""):
    """Another process holding the flock on `path` (writing `text` into it first); kill it to let go."""
    code = f"""
        import fcntl, os, sys, time
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, {text.encode()!r})
        print("MARK", flush=True)
        sys.stdin.read()
        """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "MARK"
    return proc


def let_go(proc):
    proc.kill()
    proc.wait()


def ours(folder):
    """The locks this process holds under `folder` (other tests' solvers may still hold theirs)."""
    return [p for p in snapshot_lock._held if p.startswith(str(folder))]


def open_fds():
    gc.collect()  # pipes of finished child processes are closed when their objects go
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


@pytest.fixture(autouse=True)
def nothing_held():
    gc.collect()  # solvers of earlier tests that are gone let go of their prefixes
    before = set(snapshot_lock._held)
    yield
    gc.collect()
    left = {path: entry for path, entry in snapshot_lock._held.items() if path not in before}
    for path, (fd, _) in left.items():  # let go, so that one failure does not fail the tests after it
        snapshot_lock._held.pop(path)
        os.close(fd)
    assert left == {}, "a test left a lock held"


def test_lock_path_is_hidden_beside_the_snapshots(tmp_path, monkeypatch):
    assert snapshot_lock.lock_path("/a/b/lenet") == "/a/b/.lenet.lock"
    # a prefix ending in a separator names files "_iter_N.*" inside that folder: its lock is there too (it
    # was once put beside the folder, shared with the prefix "/a/b/snapshots", which writes elsewhere)
    assert snapshot_lock.lock_path("/a/b/snapshots/") == "/a/b/snapshots/.snapshot.lock"
    assert snapshot_lock.lock_path("/") == "/.snapshot.lock"
    monkeypatch.chdir(tmp_path)
    assert snapshot_lock.lock_path("out/net") == str(tmp_path / "out" / ".net.lock")  # made absolute


def test_the_holder_text_names_the_command_line_up_to_300_characters(tmp_path, monkeypatch):
    import socket
    monkeypatch.setattr(sys, "argv", ["caffe-cli", "train", "--solver", "s" * 400])
    prefix = str(tmp_path / "net")
    path = snapshot_lock.acquire(prefix)
    try:
        with open(path) as f:
            assert f.read() == f"pid {os.getpid()} on {socket.gethostname()}: caffe-cli train --solver " + \
                "s" * (300 - 25) + "\n"
    finally:
        snapshot_lock.release(prefix)


def test_acquire_writes_who_holds_it_over_a_leftover_file(tmp_path, monkeypatch):
    import socket
    monkeypatch.setattr(sys, "argv", ["caffe-cli", "train"])
    prefix = str(tmp_path / "net")
    path = snapshot_lock.lock_path(prefix)
    with open(path, "w") as f:  # a killed training's lock file (kill -9 skips the unlink), longer than ours
        f.write("x" * 2000)
    assert snapshot_lock.acquire(prefix) == path
    try:
        with open(path) as f:
            assert f.read() == f"pid {os.getpid()} on {socket.gethostname()}: caffe-cli train\n"
    finally:
        snapshot_lock.release(prefix)
    assert not os.path.exists(path)


def test_the_lock_stays_with_this_process(tmp_path):
    """Programs the training starts (a data loader, a shell) do not inherit the lock's descriptor, which would
    keep the prefix locked after the training ends; the file gets the mode of any new file (no x bits)."""
    prefix = str(tmp_path / "net")
    path = snapshot_lock.acquire(prefix)
    try:
        fd = snapshot_lock._held[path][0]
        child = subprocess.run([sys.executable, "-c", f"import os; os.fstat({fd})"], close_fds=False,
                               capture_output=True, text=True)
        assert "Bad file descriptor" in child.stderr, child.stderr
        umask = os.umask(0)
        os.umask(umask)
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    finally:
        snapshot_lock.release(prefix)


def test_solvers_of_one_process_count_their_holds(tmp_path):
    prefix = str(tmp_path / "net")
    path = snapshot_lock.lock_path(prefix)
    # descriptor 0 open (the lowest free number is what os.open returns): were the lock's descriptor 0, closing
    # the count (0 after the last release) instead of it would pass unseen; earlier tests may have closed it
    stdin = None
    try:
        os.fstat(0)
    except OSError:
        stdin = os.open(os.devnull, os.O_RDONLY)
    snapshot_lock.acquire(prefix)
    snapshot_lock.acquire(prefix)
    assert snapshot_lock._held[path][1] == 2
    snapshot_lock.release(prefix)
    assert os.path.exists(path) and path in snapshot_lock._held  # the other solver still holds it
    assert probe(path) == "HELD"  # and another process is still kept out
    fd = snapshot_lock._held[path][0]
    snapshot_lock.release(prefix)
    assert not os.path.exists(path) and path not in snapshot_lock._held
    assert fd != 0
    with pytest.raises(OSError):
        os.fstat(fd)  # the lock's descriptor is closed
    os.fstat(0)  # and nothing else
    if stdin is not None:
        os.close(stdin)
    snapshot_lock.release(prefix)  # releasing what is not held: nothing happens
    assert path not in snapshot_lock._held


def probe(path):
    """Whether another process finds the flock on `path` taken."""
    code = f"""
        import fcntl, os
        fd = os.open({str(path)!r}, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print("HELD")
        else:
            print("FREE")
        """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60).stdout.strip()


def test_a_holder_that_wrote_nothing_is_another_process(tmp_path):
    prefix = str(tmp_path / "net")
    other = hold(snapshot_lock.lock_path(prefix))
    try:
        with pytest.raises(SolverError) as info:
            snapshot_lock.acquire(prefix)
        assert f"snapshot_prefix '{prefix}' is in use by another training (another process; lock file " in \
            str(info.value)
        assert snapshot_lock.held_by_other(prefix) == "another process"
    finally:
        let_go(other)


def test_held_by_other(tmp_path):
    prefix = str(tmp_path / "net")
    path = snapshot_lock.lock_path(prefix)
    assert snapshot_lock.held_by_other(prefix) is None  # no lock file
    other = hold(path, "pid 1 on elsewhere: caffe train\n")
    try:
        assert snapshot_lock.held_by_other(prefix) == "pid 1 on elsewhere: caffe train"
        assert os.path.exists(path)  # another's lock file is left alone
    finally:
        let_go(other)
    # a killed training's lock file that nobody holds: not in use, and removed
    assert snapshot_lock.held_by_other(prefix) is None
    assert not os.path.exists(path)
    # held by this process: not another's
    snapshot_lock.acquire(prefix)
    try:
        assert snapshot_lock.held_by_other(prefix) is None and os.path.exists(path)
    finally:
        snapshot_lock.release(prefix)


def test_holder_text_is_bounded_and_never_fails(tmp_path):
    path = str(tmp_path / ".net.lock")
    assert snapshot_lock._holder(path) == "another process"  # gone (released between our flock and the read)
    with open(path, "wb") as f:
        f.write(b"pid 7 \xff\xfe " + b"a" * 600 + b"\n")  # not UTF-8, and longer than a holder writes
    assert snapshot_lock._holder(path) == "pid 7 \ufffd\ufffd " + "a" * 503
    with open(path, "wb") as f:
        f.write(b" \n")
    assert snapshot_lock._holder(path) == "another process"


def test_prefix_in_a_missing_directory_is_named(tmp_path):
    prefix = str(tmp_path / "missing" / "net")
    fds = open_fds()
    with pytest.raises(SolverError) as info:
        snapshot_lock.acquire(prefix)
    assert str(info.value) == (f"Cannot lock snapshot_prefix '{prefix}' ({tmp_path / 'missing' / '.net.lock'}): "
                               f"No such file or directory. Make sure that the directory exists and is writable.")
    assert open_fds() == fds
    assert snapshot_lock.held_by_other(prefix) is None


@pytest.mark.parametrize("code", [errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES])
def test_flock_refusals_mean_held(tmp_path, monkeypatch, code):
    def held(fd, op):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(fcntl, "flock", held)
    prefix = str(tmp_path / "net")
    fds = open_fds()
    with pytest.raises(SolverError, match="is in use by another training"):
        snapshot_lock.acquire(prefix)
    assert open_fds() == fds  # the descriptor was closed


def test_other_flock_errors_are_named_and_leak_nothing(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    prefix = str(tmp_path / "net")
    fds = open_fds()
    with pytest.raises(SolverError, match=r"^Cannot lock snapshot_prefix .*: No locks available\. Make sure"):
        snapshot_lock.acquire(prefix)
    assert open_fds() == fds
    assert snapshot_lock.held_by_other(prefix) is None  # an error there is not "held by another"


@pytest.mark.parametrize("recreated", [True, False])
def test_lock_file_replaced_between_open_and_flock(tmp_path, monkeypatch, recreated):
    """The holder before us removes its file after our open: the flock we get is on a file nobody else
    will look at, so the lock is taken again on the file now at the path."""
    prefix = str(tmp_path / "net")
    path = snapshot_lock.lock_path(prefix)
    real = fcntl.flock
    calls = []

    def racing(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(path)
            if recreated:
                open(path, "w").close()
        return real(fd, op)
    monkeypatch.setattr(fcntl, "flock", racing)
    fds = open_fds()
    snapshot_lock.acquire(prefix)
    try:
        assert len(calls) == 2
        fd = snapshot_lock._held[path][0]
        assert os.path.samestat(os.fstat(fd), os.stat(path))
        assert open_fds() == fds + 1  # the first descriptor was closed
    finally:
        snapshot_lock.release(prefix)
    assert not os.path.exists(path) and open_fds() == fds


def test_release_when_the_lock_file_is_already_gone(tmp_path):
    prefix = str(tmp_path / "net")
    path = snapshot_lock.lock_path(prefix)
    fds = open_fds()
    snapshot_lock.acquire(prefix)
    os.unlink(path)
    snapshot_lock.release(prefix)
    assert path not in snapshot_lock._held and open_fds() == fds


@pytest.mark.parametrize("base", ["net", ""])  # "": a prefix naming a folder ("snapshots/")
def test_acquire_removes_temporaries_of_killed_snapshots(tmp_path, caplog, base):
    prefix = os.path.join(tmp_path, base)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    mine = temp_name(prefix + "_iter_4.caffemodel")  # this process's: still being written
    stale = [os.path.join(tmp_path, f".{base}_iter_{i}.caffemodel.tmp-{dead}-0123abcd") for i in (2, 3)]
    other = os.path.join(tmp_path, f".other_iter_2.caffemodel.tmp-{dead}-0123abcd")  # another prefix's
    for name in stale + [mine, other]:
        open(name, "w").close()
    with caplog.at_level(logging.INFO, logger="caffe.solver"):
        path = snapshot_lock.acquire(prefix)
    snapshot_lock.release(prefix)
    assert path == os.path.join(tmp_path, f".{base or 'snapshot'}.lock")
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(n) for n in (mine, other))
    logged = [r.getMessage() for r in caplog.records]
    for name in stale:
        assert f"Removed {name}, a temporary file left by an interrupted snapshot" in logged


# -- the solver's use of the lock ------------------------------------------------------------------------

def solver(prefix, **extra):
    pytest.importorskip("caffe.net", reason="caffe-net (caffe.net.Net) is not installed")
    from caffe.blob import context
    from caffe.solver import Solver
    from caffe.solver.testing import least_squares_net, solver_param
    context.set_random_seed(1)
    fields = dict(type="SGD", base_lr=0.01, lr_policy="fixed", display=0, max_iter=2, snapshot_after_train=True,
                  random_seed=1)
    if prefix is not None:
        fields["snapshot_prefix"] = str(prefix)
    fields.update(extra)
    return Solver(solver_param(least_squares_net(2, 2), **fields))


def test_solve_releases_the_prefix_when_training_fails(tmp_path, monkeypatch):
    s = solver(tmp_path / "f")
    seen = []

    def update():
        seen.append(sorted(os.listdir(tmp_path)))
        raise RuntimeError("update failed")
    monkeypatch.setattr(s, "ApplyUpdate", update)
    with pytest.raises(RuntimeError, match="update failed"):
        s.Solve()
    assert seen == [[".f.lock"]]  # held while training
    assert os.listdir(tmp_path) == [] and s._prefix_locked is None


def test_solve_keeps_the_hold_of_a_step_driven_solver(tmp_path):
    s = solver(tmp_path / "k", max_iter=3)
    s.step(1)
    s.Snapshot()  # holds the prefix from here on
    s.Solve()
    assert ".k.lock" in os.listdir(tmp_path)  # Solve did not take it, so it does not release it
    s.release_snapshot_prefix()
    s.release_snapshot_prefix()  # twice: nothing more to release
    assert ".k.lock" not in os.listdir(tmp_path)


def test_a_solver_that_is_dropped_lets_go_of_the_prefix(tmp_path):
    import gc
    s = solver(tmp_path / "d")
    s.step(1)
    s.Snapshot()
    assert ".d.lock" in os.listdir(tmp_path)
    del s
    gc.collect()
    assert ".d.lock" not in os.listdir(tmp_path)


def test_no_prefix_no_lock(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = solver(None, snapshot_after_train=False)
    during = []
    s.add_callback(lambda: during.append((os.listdir(tmp_path), ours(tmp_path))), lambda: None)
    s.Solve()
    assert during == [([], [])] * 2
    assert os.listdir(tmp_path) == [] and not ours(tmp_path)


def test_overwrite_snapshots_warns_only_when_another_training_holds_the_prefix(tmp_path, caplog):
    prefix = tmp_path / "o"
    s = solver(prefix)
    s.overwrite_snapshots = True
    with caplog.at_level(logging.WARNING, logger="caffe.solver"):
        s.Solve()
    assert not [r for r in caplog.records if "in use by another training" in r.getMessage()]
    assert snapshot_lock.lock_path(str(prefix)) not in snapshot_lock._held and not os.path.exists(snapshot_lock.lock_path(str(prefix)))
    other = hold(snapshot_lock.lock_path(str(prefix)), "pid 1 on elsewhere: caffe train")
    try:
        s = solver(prefix, max_iter=3)
        s.overwrite_snapshots = True
        with caplog.at_level(logging.WARNING, logger="caffe.solver"):
            s.Solve()
        assert (tmp_path / "o_iter_3.caffemodel").exists()
        # said when training starts and again at each snapshot (here the one after training)
        assert [r.getMessage() for r in caplog.records if "in use by another training" in r.getMessage()] == 2 * [
            f"snapshot_prefix {prefix} is in use by another training (pid 1 on elsewhere: caffe train); writing "
            f"there anyway (overwrite_snapshots)"]
        assert snapshot_lock.lock_path(str(prefix)) not in snapshot_lock._held and os.path.exists(snapshot_lock.lock_path(str(prefix)))
    finally:
        let_go(other)


def test_a_prefix_naming_a_folder_trains_and_locks_inside_it(tmp_path):
    folder = tmp_path / "snaps"
    folder.mkdir()
    s = solver(f"{folder}{os.sep}")
    s.step(1)
    try:
        s.Snapshot()
        assert sorted(os.listdir(folder)) == [".snapshot.lock", "_iter_1.caffemodel", "_iter_1.solverstate"]
        assert os.listdir(tmp_path) == ["snaps"]
    finally:
        s.release_snapshot_prefix()
    assert ".snapshot.lock" not in os.listdir(folder)
