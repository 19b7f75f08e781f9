"""How much memory an allocation may take, checked before it is made.

Linux overcommits: a 20 GB `np.empty` succeeds, and the process is killed by the
OOM killer (no message) when the memory is first touched. So SyncedMemory checks
every large host allocation against `available_memory()` first and raises
`BlobMemoryError` (with the bytes it needs); Net setup re-raises it naming the
layer, blob and shape, and refuses a net whose blobs cannot fit before any of
them is allocated.

`available_memory()` is the smallest of what applies: the kernel's MemAvailable
plus free swap, the cgroup's limit minus its usage (file cache counted as free),
and the address-space and data-segment limits (`ulimit -v` / `-d`) minus what the
process maps. It only refuses what cannot fit; it never promises that something will.
"""
from __future__ import annotations

import os
import resource

from caffe.blob.fileio import format_bytes

# Below this, an allocation is not worth a look at /proc (~0.2 ms; zero-filling 16 MiB takes ~3 ms).
CHECK_THRESHOLD = 16 << 20
_UNLIMITED = 1 << 60


class BlobMemoryError(MemoryError, RuntimeError):
    """An allocation that does not fit in the memory available; names what it needed.

    A MemoryError (and, so that command-line tools report it as bad input in one line, a
    RuntimeError). `nbytes` is what was asked, `available` what was free at the time.
    """

    def __init__(self, message: str, nbytes: int | None = None, available: int | None = None):
        super().__init__(message)
        self.nbytes = nbytes
        self.available = available

    def __reduce__(self):
        return type(self), (str(self), self.nbytes, self.available)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _meminfo() -> int | None:
    text = _read("/proc/meminfo")
    if text is None:
        return None
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name] = int(parts[0]) * 1024
    if "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0)


def _cgroup_paths() -> list[tuple[str, str]]:
    """[(version, folder)] of this process's memory cgroup(s)."""
    text = _read("/proc/self/cgroup") or ""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            out.append(("2", os.path.join("/sys/fs/cgroup", rel)))
            out.append(("2", "/sys/fs/cgroup"))  # in a container the cgroup is often mounted as the root
        elif "memory" in controllers.split(","):
            out.append(("1", os.path.join("/sys/fs/cgroup/memory", rel)))
            out.append(("1", "/sys/fs/cgroup/memory"))
    return out


def _stat_file_bytes(folder: str) -> int:
    """The cgroup's page cache (active + inactive file pages; v1's hierarchical totals when given)."""
    text = _read(os.path.join(folder, "memory.stat")) or ""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        try:
            values[name] = int(value)
        except ValueError:
            pass
    prefix = "total_" if "total_active_file" in values else ""
    return values.get(prefix + "active_file", 0) + values.get(prefix + "inactive_file", 0)


def _cgroup_available() -> int | None:
    for version, folder in _cgroup_paths():
        if version == "2":
            limit, usage = _read(os.path.join(folder, "memory.max")), _read(os.path.join(folder, "memory.current"))
        else:
            limit = _read(os.path.join(folder, "memory.limit_in_bytes"))
            usage = _read(os.path.join(folder, "memory.usage_in_bytes"))
        if limit is None or usage is None:
            continue
        limit = limit.strip()
        if limit == "max":
            return None
        try:
            limit_b, usage_b = int(limit), int(usage.strip())
        except ValueError:
            continue
        if limit_b >= _UNLIMITED:
            return None
        # page cache is charged to the cgroup but is reclaimed before anything is killed
        return max(0, limit_b - usage_b + _stat_file_bytes(folder))
    return None


def _vm_bytes() -> dict:
    text = _read("/proc/self/status") or ""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmSize", "VmData"):
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * 1024
    return out


def _rlimit_available() -> int | None:
    best = None
    vm = None
    for limit_name, vm_name in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        which = getattr(resource, limit_name, None)
        if which is None:
            continue
        soft, _ = resource.getrlimit(which)
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        if vm is None:
            vm = _vm_bytes()
        if vm_name in vm:
            left = max(0, soft - vm[vm_name])
            best = left if best is None else min(best, left)
    return best


def available_memory() -> int | None:
    """Bytes of host memory a new allocation may still take, or None when nothing says."""
    values = [v for v in (_meminfo(), _cgroup_available(), _rlimit_available()) if v is not None]
    return min(values) if values else None


def check_host_allocation(nbytes: int, what: str = "a blob") -> None:
    """Raise BlobMemoryError when `nbytes` of host memory cannot be had (checked from 16 MiB up)."""
    if nbytes < CHECK_THRESHOLD:
        return
    available = available_memory()
    if available is not None and nbytes > available:
        raise BlobMemoryError(f"cannot allocate {format_bytes(nbytes)} for {what}: only "
                              f"{format_bytes(available)} of memory is available", nbytes, available)


def available_device_memory() -> int | None:
    """Free bytes on the current GPU (the driver's free memory plus CuPy's pool's free blocks)."""
    try:
        import cupy
        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())
    except Exception:
        return None


__all__ = ["BlobMemoryError", "available_memory", "available_device_memory", "check_host_allocation",
           "CHECK_THRESHOLD"]
