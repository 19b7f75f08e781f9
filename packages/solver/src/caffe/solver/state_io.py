"""Solver-state files, byte-compatible with Caffe's, written atomically.

Binary: a serialized SolverState {iter, learned_net, history (one BlobProto per history
blob), current_step}. HDF5 (SnapshotSolverStateToHDF5): datasets `iter` (int32, shape
[1]), `learned_net` (a scalar NUL-terminated fixed-length string, as H5LTmake_dataset_string
writes it), `current_step` (int32, [1]) and a group `history` holding datasets "0".."n-1"
shaped like their blobs. Every file goes to a temporary name in the target directory first
and is moved over the target with os.replace, so an interrupted snapshot never leaves a
truncated file behind under the real name.
"""
from __future__ import annotations

import os

import numpy as np

from caffe.net.protofile import atomic_open, atomic_path
from caffe.solver.params import SolverError


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file beside it, fsync, rename): a crash leaves the old file."""
    with atomic_open(path) as f:
        f.write(data)


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
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SolverError(f"solver state file {path!r} not found") from None
    state = caffe_pb2.SolverState()
    try:
        state.ParseFromString(data)
    except DecodeError as exc:
        raise SolverError(f"solver state file {path!r} is not a binary SolverState ({exc}); "
                          f"HDF5 states must end in .h5") from None
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
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            _save_int(f, "iter", iter_)
            _save_string(f, "learned_net", learned_net)
            _save_int(f, "current_step", current_step)
            group = f.create_group("history")
            for i, blob in enumerate(history):
                group.create_dataset(str(i), data=np.ascontiguousarray(blob.cpu_data()))


def _load_int(f, name: str, path: str) -> int:
    if name in f:
        return int(np.asarray(f[name][()]).ravel()[0])
    if name in f.attrs:
        return int(np.asarray(f.attrs[name]).ravel()[0])
    raise SolverError(f"HDF5 solver state {path!r} has no {name!r}")


def _load_string(f, name: str):
    if name in f:
        value = f[name][()]
    elif name in f.attrs:
        value = f.attrs[name]
    else:
        return None
    if isinstance(value, np.ndarray):
        value = value.ravel()[0] if value.size else b""
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode()
    return str(value)


def read_state_hdf5(path: str):
    """(iter, learned_net or None, current_step, [history arrays]) from an HDF5 solver state."""
    h5py = _h5py()
    if not os.path.exists(path):
        raise SolverError(f"solver state file {path!r} not found")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise SolverError(f"cannot open HDF5 solver state {path!r}: {exc}") from None
    with f:
        iter_ = _load_int(f, "iter", path)
        learned_net = _load_string(f, "learned_net")
        current_step = _load_int(f, "current_step", path) if ("current_step" in f or
                                                              "current_step" in f.attrs) else 0
        if "history" not in f:
            raise SolverError(f"HDF5 solver state {path!r} has no 'history' group")
        group = f["history"]
        n = len(group)
        history = []
        for i in range(n):
            if str(i) not in group:
                raise SolverError(f"HDF5 solver state {path!r}: history/{i} is missing "
                                  f"(history holds {sorted(group.keys())})")
            history.append(np.asarray(group[str(i)][()]))
    return iter_, learned_net, current_step, history
