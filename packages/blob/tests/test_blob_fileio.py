"""caffe.blob.fileio: bounded reads of regular files only, atomic writes that honour the umask and leave
nothing behind, stale temporaries cleaned, and the watcher that removes a killed writer's work."""
import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from caffe.blob import fileio
from caffe.blob.fileio import FileInputError, WriteError


def _run(code: str, timeout: float = 60, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, **kw)


# -- reading ---------------------------------------------------------------------------------------

def test_regular_file_is_read_whole(tmp_path):
    p = tmp_path / "a.bin"
    p.write_bytes(b"\x00\x01abc")
    assert fileio.read_regular_file(p) == b"\x00\x01abc"
    assert fileio.read_text_file(tmp_path / "a.bin") == "\x00\x01abc"
    assert fileio.require_regular_file(p) == 5


def test_missing_and_directory_are_named(tmp_path):
    with pytest.raises(FileInputError, match=r"Cannot open weights file '.*nope': no such file"):
        fileio.read_regular_file(tmp_path / "nope", "weights file")
    with pytest.raises(FileInputError, match="it is a directory"):
        fileio.read_regular_file(tmp_path, "weights file")


def test_dev_zero_is_refused_before_reading():
    # /dev/zero would be read forever (the issue: RSS grew 2.5 GB/s)
    with pytest.raises(FileInputError, match=r"'/dev/zero': it is a character device, not a regular file"):
        fileio.read_regular_file("/dev/zero", "--model file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # in a child, so that a regression (blocking open) fails by timeout instead of hanging the suite
    proc = _run(f"""
        from caffe.blob.fileio import read_regular_file, FileInputError
        try:
            read_regular_file({str(fifo)!r}, "--solver file")
        except FileInputError as exc:
            print(exc)
        """, timeout=60)
    assert "it is a FIFO (named pipe), not a regular file" in proc.stdout, proc.stderr


def test_size_beyond_the_format_limit_is_refused(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"x" * 100)
    with pytest.raises(FileInputError, match=r"more than the 64 bytes a BlobProto can hold"):
        fileio.read_regular_file(p, "mean_file", limit=64, fmt="a BlobProto")


def test_procfs_file_without_a_size_is_read_bounded():
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no procfs")
    assert "Name:" in fileio.read_text_file("/proc/self/status")
    with pytest.raises(FileInputError, match="more than"):
        fileio.read_regular_file("/proc/self/status", limit=10)


def test_binary_file_read_as_text_gets_a_clear_error(tmp_path):
    p = tmp_path / "model.caffemodel"
    p.write_bytes(b"\n\x05LeNet\xff\xfe")
    with pytest.raises(FileInputError, match=r"it is not a text file .* at byte 7"):
        fileio.read_text_file(p, "NetParameter file")


# -- writing ---------------------------------------------------------------------------------------

def _leftovers(d):
    return sorted(n for n in os.listdir(d) if n.startswith("."))


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_write_honours_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        fileio.atomic_write_bytes(tmp_path / "out.bin", b"data")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "out.bin").st_mode) == 0o666 & ~mask
    assert (tmp_path / "out.bin").read_bytes() == b"data" and not _leftovers(tmp_path)


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.caffemodel"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with fileio.atomic_open(target) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and not _leftovers(tmp_path)


def test_disk_full_names_the_file_and_keeps_errno(tmp_path):
    target = tmp_path / "lenet_iter_10.caffemodel"

    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError) as info:
        with fileio.atomic_path(target, "caffemodel") as tmp:
            Full().write(tmp)
    exc = info.value
    assert exc.errno == errno.ENOSPC and isinstance(exc, OSError) and exc.filename == str(target)
    assert f"Cannot write caffemodel '{target}': No space left on device (the disk is full)" in str(exc)
    assert not os.listdir(tmp_path)


def test_disk_full_for_real_with_a_file_size_limit(tmp_path):
    # RLIMIT_FSIZE makes write() fail with EFBIG, as a full disk makes it fail with ENOSPC
    target = tmp_path / "big.bin"
    proc = _run(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from caffe.blob.fileio import atomic_write_bytes, WriteError
        try:
            atomic_write_bytes({str(target)!r}, b"x" * 100000, "snapshot")
        except WriteError as exc:
            print("ERR", exc.errno, exc)
        """)
    assert f"ERR {errno.EFBIG} Cannot write snapshot '{target}'" in proc.stdout, proc.stderr
    assert not os.listdir(tmp_path)


def test_unwritable_directory_is_named(tmp_path):
    with pytest.raises(WriteError, match=r"Cannot write file '.*/no/such/dir/x.bin'"):
        fileio.atomic_write_bytes(tmp_path / "no" / "such" / "dir" / "x.bin", b"")


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".model.caffemodel.tmp-{dead}-0123abcd"
    live = tmp_path / f".model.caffemodel.tmp-{os.getppid()}-0123abcd"  # our parent is alive
    other = tmp_path / f".other.bin.tmp-{dead}-0123abcd"
    for p in (stale, live, other):
        p.write_bytes(b"partial")
    fileio.atomic_write_bytes(tmp_path / "model.caffemodel", b"new")
    assert not stale.exists() and live.exists() and other.exists()


def test_kill_during_an_atomic_write_leaves_only_a_temporary_the_next_write_removes(tmp_path):
    target = tmp_path / "lenet_iter_5.caffemodel"
    target.write_bytes(b"previous")
    code = f"""
        import sys, threading
        from caffe.blob.fileio import atomic_open
        with atomic_open({str(target)!r}) as f:
            f.write(b"half of the new weights"); f.flush()
            print("MARK", flush=True)
            threading.Event().wait()
        """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "MARK"  # the temporary is written and open
    finally:
        proc.kill()
        proc.wait()
    assert target.read_bytes() == b"previous"
    temps = _leftovers(tmp_path)
    assert len(temps) == 1 and temps[0].startswith(".lenet_iter_5.caffemodel.tmp-")
    fileio.atomic_write_bytes(target, b"again")
    assert target.read_bytes() == b"again" and not _leftovers(tmp_path)


def test_reaper_removes_a_killed_writers_folder(tmp_path):
    partial = tmp_path / ".db.partial-x"
    code = f"""
        import os, threading
        from caffe.blob.fileio import reap_on_exit
        os.mkdir({str(partial)!r})
        open(os.path.join({str(partial)!r}, "data.mdb"), "wb").write(b"x" * 1000)
        assert reap_on_exit({str(partial)!r})
        print("MARK", flush=True)
        threading.Event().wait()
        """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "MARK"
        assert partial.is_dir()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _wait_gone(partial)


def test_unreaped_paths_are_kept(tmp_path):
    kept = tmp_path / "kept"
    proc = _run(f"""
        import os
        from caffe.blob.fileio import reap_on_exit, unreap
        os.mkdir({str(kept)!r})
        reap_on_exit({str(kept)!r})
        unreap({str(kept)!r})
        """)
    assert proc.returncode == 0, proc.stderr
    assert kept.is_dir()


def _wait_gone(path, deadline_s: float = 60.0):
    """Wait (bounded) for the watcher process, which acts on the writer's death, to remove `path`."""
    end = time.monotonic() + deadline_s
    while path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not path.exists(), f"{path} was not removed after its writer was killed"
