"""Solver-state files, byte-compatible with Caffe's, written atomically.

Binary: a serialized SolverState {iter, learned_net, history (one BlobProto per history
blob), current_step}. HDF5 (SnapshotSolverStateToHDF5): datasets `iter` (int32, shape
[1]), `learned_net` (a scalar NUL-terminated fixed-length string, as H5LTmake_dataset_string
writes it), `current_step` (int32, [1]) and a group `history` holding datasets "0".."n-1"
shaped like their blobs. Every file goes to a temporary name in the target directory first
and is moved over the target with os.replace, so an interrupted snapshot never leaves a
truncated file behind under the real name (caffe.blob.fileio).

Reading checks what Caffe takes on trust: only a regular file is read, and a negative
iter or current_step, or a learned_net that is present but empty, is refused; a state
without learned_net (Caffe restores only the history then) gets a warning.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from caffe.blob.fileio import FileInputError, PROTO_LIMIT, atomic_path, read_regular_file, require_regular_file
from caffe.blob.fileio import atomic_write_bytes as _atomic_write_bytes
from caffe.net.protofile import check_strings
from caffe.solver.params import SolverError

log = logging.getLogger("caffe.solver")


def atomic_write_bytes(path: str, data: bytes, what: str = "solver state") -> None:
    """Write `data` to `path` atomically (temp file beside it, fsync, rename): a crash leaves the old file."""
    _atomic_write_bytes(path, data, what)


def check_state(path: str, iter_: int, learned_net, current_step: int) -> None:
    """Refuse what no solver writes: a negative iteration or step, an empty learned_net; warn when absent."""
    if iter_ < 0:
        raise SolverError(f"solver state {path!r} gives iteration {iter_}; an iteration is never negative "
                          f"(the file is corrupt or was not written by a solver)")
    if current_step < 0:
        raise SolverError(f"solver state {path!r} gives current_step {current_step}; it is never negative")
    if learned_net is None:
        log.warning("Solver state %s names no learned_net: only the solver's history is restored, the net "
                    "keeps its current weights (pass --weights as well, or restore a state that names its "
                    "caffemodel)", path)
    elif not learned_net:
        raise SolverError(f"solver state {path!r} has an empty learned_net: the weights to resume from are not "
                          f"named, so training cannot resume where it stopped")


def _require_state_file(path: str) -> None:
    if not os.path.exists(path):
        raise SolverError(f"solver state file {path!r} not found")
    try:
        require_regular_file(path, "solver state file")  # /dev/zero or a FIFO: refused, never read
    except FileInputError as exc:
        raise SolverError(str(exc)) from None


# -- binary ---------------------------------------------------------------------------

def write_state_binary(path: str, iter_: int, learned_net: str, current_step: int, history) -> None:
    from caffe.proto import caffe_pb2
    state = caffe_pb2.SolverState()
    state.iter = int(iter_)
    state.learned_net = learned_net
    state.current_step = int(current_step)
    for blob in history:
        blob.to_proto(write_diff=False, proto=state.history.add())
    atomic_write_bytes(path, state.SerializeToString())


def read_state_binary(path: str):
    from caffe.proto import caffe_pb2
    from google.protobuf.message import DecodeError
    _require_state_file(path)
    try:
        data = read_regular_file(path, "solver state file", PROTO_LIMIT, "a SolverState")
    except FileInputError as exc:
        raise SolverError(str(exc)) from None
    state = caffe_pb2.SolverState()
    try:
        state.ParseFromString(data)
        check_strings(state)  # a learned_net that is not UTF-8
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise SolverError(f"solver state file {path!r} is not a binary SolverState ({exc}); "
                          f"HDF5 states must end in .h5") from None
    check_state(path, state.iter, state.learned_net if state.HasField("learned_net") else None,
                state.current_step)
    return state


# -- HDF5 -----------------------------------------------------------------------------

def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a declared dependency
        raise SolverError("HDF5 snapshots need h5py (pip install h5py)") from None
    return h5py


def _save_int(f, name: str, value: int) -> None:
    f.create_dataset(name, data=np.array([int(value)], dtype=np.int32))


def _save_string(f, name: str, value: str) -> None:
    """A scalar fixed-length NUL-terminated C string, as H5LTmake_dataset_string makes it."""
    h5py = _h5py()
    raw = value.encode()
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    sid = h5py.h5s.create(h5py.h5s.SCALAR)
    dset = h5py.h5d.create(f.id, name.encode(), tid, sid)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw + b"\0", dtype=f"S{len(raw) + 1}"))


def write_state_hdf5(path: str, iter_: int, learned_net: str, current_step: int, history) -> None:
    h5py = _h5py()
    with atomic_path(path, "solver state") as tmp:
        with h5py.File(tmp, "w") as f:
            _save_int(f, "iter", iter_)
            _save_string(f, "learned_net", learned_net)
            _save_int(f, "current_step", current_step)
            group = f.create_group("history")
            for i, blob in enumerate(history):
                group.create_dataset(str(i), data=np.ascontiguousarray(blob.cpu_data()))


def _dataset(f, name: str, path: str):
    """f[name] as a Dataset, or a SolverError naming the file when something else is there."""
    h5py = _h5py()
    item = f[name]
    if not isinstance(item, h5py.Dataset):
        raise SolverError(f"HDF5 solver state {path!r}: {name!r} is a {type(item).__name__.lower()}, where a "
                          f"solver writes a dataset")
    return item


def _load_int(f, name: str, path: str) -> int:
    if name in f:
        value = _dataset(f, name, path)[()]
    elif name in f.attrs:
        value = f.attrs[name]
    else:
        raise SolverError(f"HDF5 solver state {path!r} has no {name!r}")
    arr = np.asarray(value)
    if arr.dtype.kind not in "iuf" or arr.size != 1 or not np.isfinite(arr).all():
        raise SolverError(f"HDF5 solver state {path!r}: {name!r} holds {arr.size} value(s) of type {arr.dtype}; "
                          f"a solver writes one integer")
    return int(arr.ravel()[0])


def _load_string(f, name: str, path: str = "?"):
    if name in f:
        value = _dataset(f, name, path)[()]
    elif name in f.attrs:
        value = f.attrs[name]
    else:
        return None
    if isinstance(value, np.ndarray):
        value = value.ravel()[0] if value.size else b""
    if isinstance(value, (bytes, np.bytes_)):
        try:
            value = bytes(value).split(b"\0", 1)[0].decode()
        except UnicodeDecodeError:
            raise SolverError(f"HDF5 solver state {path!r}: {name!r} is not a UTF-8 file name") from None
    if not isinstance(value, str):
        raise SolverError(f"HDF5 solver state {path!r}: {name!r} holds {type(value).__name__}, where a solver "
                          f"writes a string")
    return value


def read_state_hdf5(path: str):
    """(iter, learned_net or None, current_step, [history arrays]) from an HDF5 solver state."""
    h5py = _h5py()
    _require_state_file(path)
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise SolverError(f"cannot open HDF5 solver state {path!r}: {exc}") from None
    with f:
        iter_ = _load_int(f, "iter", path)
        learned_net = _load_string(f, "learned_net", path)
        current_step = _load_int(f, "current_step", path) if ("current_step" in f or
                                                              "current_step" in f.attrs) else 0
        if "history" not in f:
            raise SolverError(f"HDF5 solver state {path!r} has no 'history' group")
        group = f["history"]
        if not isinstance(group, h5py.Group):
            raise SolverError(f"HDF5 solver state {path!r}: 'history' is a dataset, where a solver writes a group "
                              f"of datasets history/0, history/1, ...")
        n = len(group)
        history = []
        for i in range(n):
            if str(i) not in group:
                raise SolverError(f"HDF5 solver state {path!r}: history/{i} is missing "
                                  f"(history holds {sorted(group.keys())})")
            ds = _dataset(group, str(i), path)
            if ds.dtype.kind not in "fiu":
                raise SolverError(f"HDF5 solver state {path!r}: history/{i} holds {ds.dtype} values, not numbers")
            history.append(np.asarray(ds[()]))
    check_state(path, iter_, learned_net, current_step)
    return iter_, learned_net, current_step, history
