"""The CuPy stand-in (caffe.blob._standin) itself: strict at the host boundary, devices, streams, NCCL.

These run in the normal (CPU) run, on the stand-in's module without installing it as `cupy`.
"""
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import _standin
from caffe.blob._standin import nccl, transfers

cp = _standin.module()


@pytest.fixture(autouse=True)
def on_device_0():
    cp.cuda.Device(0).use()
    yield
    cp.cuda.Device(0).use()


# --------------------------------------------------------------------------------- the host boundary

def test_device_arrays_refuse_implicit_host_conversion():
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    host = np.ones((2, 3), np.float32)
    for convert in (np.asarray, np.array, lambda x: np.float32(x), lambda x: float(x), lambda x: host + x,
                    lambda x: x + host, lambda x: np.add(host, x), lambda x: cp.add(x, host), lambda x: x * [1, 2, 3],
                    lambda x: np.concatenate([host, x]), lambda x: cp.concatenate([host, x]),
                    lambda x: cp.where(x > 0, host, x), lambda x: cp.matmul(x, host.T)):
        with pytest.raises(TypeError):
            convert(a)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        a[...] = host
    with pytest.raises(TypeError):
        a[...] = [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(TypeError):
        np.copyto(host, a)  # a device->host copy must be explicit (a.get(out=host))


def test_explicit_transfers_work_and_are_counted():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    with transfers.counting() as d:
        a = cp.asarray(host)
        b = a * 2 + 1  # on the device: no transfer
        back = cp.asnumpy(b)
        a.set(host)
        total = float(a.sum())
        listed = b[0].tolist()
        out = np.empty_like(host)
        a.get(out=out)
    np.testing.assert_array_equal(back, host * 2 + 1)
    np.testing.assert_array_equal(out, host)
    assert total == host.sum() and listed == list(host[0] * 2 + 1)
    assert (d["h2d"], d["h2d_bytes"]) == (2, 2 * host.nbytes)
    assert (d["d2h"], d["d2h_bytes"]) == (4, 2 * host.nbytes + 4 + 16)


def test_reductions_and_scalar_indexing_stay_on_the_device():
    a = cp.asarray(np.arange(6.0).reshape(2, 3))
    for r in (a.sum(), a.max(), cp.mean(a), np.sum(a), a[1, 2], a[0][1], cp.vdot(a, a), cp.allclose(a, a)):
        assert isinstance(r, cp.ndarray) and r.ndim == 0
    assert isinstance(np.exp(a), cp.ndarray)  # NumPy ufuncs on device arrays run on the device
    with pytest.raises(TypeError):
        range(a[0, 1])  # no __index__, as in CuPy
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)


def test_indexing_setitem_and_views_share_memory():
    a = cp.zeros((4, 5), cp.float32)
    v = a[1:3, ::2]
    v[...] = 7
    a[cp.asarray([0, 3]), 1] = cp.asarray([1.0, 2.0], dtype=cp.float32)
    with transfers.counting() as d:
        a[[0, 3], 4] = 5.0  # a host index list is uploaded
    assert d["h2d"] == 1
    got = a.get()
    assert got[1:3, ::2].tolist() == [[7] * 3] * 2 and got[0, 1] == 1 and got[3, 1] == 2 and got[3, 4] == 5
    assert a.reshape(-1).data.ptr == a.data.ptr and a[1].data.ptr == a.data.ptr + 5 * 4
    w = cp.ndarray((5,), cp.float32, memptr=a.data + 5 * 4)  # an array over existing device memory
    w[...] = 3
    assert (a[1] == 3).all()
    with transfers.counting() as d:
        taken = a.take(np.array([1, 3]), axis=0)  # host indices are uploaded, as CuPy does
        picked = a[a > 6]  # a mask's result size is read back, as CuPy does
        cp.take_along_axis(a, cp.zeros((4, 1), cp.int64), axis=1)
    assert taken.shape == (2, 5) and picked.get().tolist() == [7, 7, 7]
    assert (d["h2d"], d["d2h"]) == (1, 1)


@given(st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=24),
       st.sampled_from(["exp", "tanh", "abs", "sqrt_abs", "sum", "max0", "cumsum", "where", "matmul"]))
def test_stand_in_computes_what_numpy_computes(values, op):
    x = np.asarray(values, np.float32)
    d = cp.asarray(x)
    ops = {"exp": lambda m, v: m.exp(v), "tanh": lambda m, v: m.tanh(v), "abs": lambda m, v: abs(v),
           "sqrt_abs": lambda m, v: m.sqrt(m.abs(v)), "sum": lambda m, v: v.sum(), "max0": lambda m, v: m.maximum(v, 0),
           "cumsum": lambda m, v: m.cumsum(v), "where": lambda m, v: m.where(v > 0, v, 0.5 * v),
           "matmul": lambda m, v: v[:, None] @ v[None, :]}
    np.testing.assert_array_equal(ops[op](cp, d).get(), ops[op](np, x))


def test_pickle_and_copy_keep_the_device():
    with cp.cuda.Device(1):
        a = cp.arange(4.0)
    b = pickle.loads(pickle.dumps(a))
    assert b.device.id == 1 and b.get().tolist() == [0, 1, 2, 3]
    with transfers.counting() as d:
        c = a.copy()  # a copy lands on the current device (0): a device-to-device transfer
    assert c.device.id == 0 and d["p2p"] == 1


# --------------------------------------------------------------------------------- devices, streams

def test_arrays_remember_their_device_and_refuse_another():
    a = cp.ones(3)
    with cp.cuda.Device(1) as dev:
        b = cp.ones(3)
        assert b.device == dev and cp.cuda.Device().id == 1
        with pytest.raises(ValueError, match="array device = 0 while current = 1"):
            a + b
        assert b[1:].device.id == 1 and b.reshape(3, 1).device.id == 1
    assert cp.cuda.Device().id == 0
    assert b.reshape(1, 3).device.id == 1  # a view needs no kernel: allowed from any current device
    with pytest.raises(ValueError, match="array device = 1 while current = 0"):
        b.sum()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="invalid device ordinal"):
        cp.cuda.Device(7).use()
    seen = []
    t = threading.Thread(target=lambda: seen.append(cp.cuda.Device().id))  # each thread starts on device 0
    cp.cuda.Device(1).use()
    t.start()
    t.join()
    assert seen == [0] and cp.cuda.runtime.getDevice() == 1


def test_streams_and_events():
    assert cp.cuda.get_current_stream().ptr == 0
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        assert cp.cuda.get_current_stream() is s
        start = s.record()
        x = cp.ones(1000).sum()
        end = cp.cuda.Event()
        end.record(s)
    end.synchronize()
    assert cp.cuda.get_current_stream().ptr == 0 and s.ptr != 0 and float(x) == 1000
    assert cp.cuda.get_elapsed_time(start, end) >= 0


def test_memcpy_checks_pointers_and_counts():
    host = np.arange(4, dtype=np.float64)
    dev = cp.zeros(4)
    with transfers.counting() as d:
        cp.cuda.runtime.memcpy(dev.data.ptr, host.ctypes.data, host.nbytes, cp.cuda.runtime.memcpyHostToDevice)
    assert d["h2d_bytes"] == 32 and dev.get().tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not inside a device allocation"):
        cp.cuda.runtime.memcpy(host.ctypes.data, host.ctypes.data, 8, cp.cuda.runtime.memcpyDeviceToHost)
    with pytest.raises(ValueError, match="past the end"):
        cp.cuda.runtime.memcpy(host.ctypes.data, dev.data.ptr, 64, cp.cuda.runtime.memcpyDeviceToHost)


def test_hand_written_kernels_say_a_gpu_is_needed():
    k = cp.ElementwiseKernel("T x", "T y", "y = x * 2", "double_it")  # created lazily, as in CuPy
    with pytest.raises(NotImplementedError, match="'double_it'.*needs a real GPU.*device_kernels_available"):
        k(cp.ones(3))
    with pytest.raises(NotImplementedError, match="RawKernel 'f'"):
        cp.RawModule(code="extern \"C\" __global__ void f() {}").get_function("f")((1,), (1,), ())


# --------------------------------------------------------------------------------- NCCL

def _ranks(n, fn, devices=None):
    """Run fn(rank, comm) in n threads, rank r on fake device devices[r]; returns their results."""
    uid = nccl.get_unique_id()
    out, errors = [None] * n, []

    def run(r):
        try:
            with cp.cuda.Device((devices or [0] * n)[r]):
                comm = nccl.NcclCommunicator(n, uid, r)
                out[r] = fn(r, comm)
                comm.destroy()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def test_nccl_collectives_between_thread_ranks():
    def fn(r, comm):
        s = cp.cuda.Stream().ptr
        x = cp.full(5, r + 1, cp.float32)
        comm.allReduce(x.data.ptr, x.data.ptr, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
        b = cp.arange(3, dtype=cp.float64) * (r + 1)
        comm.bcast(b.data.ptr, 3, nccl.NCCL_FLOAT64, 1, s)
        m = cp.asarray([r, -r], dtype=cp.int32)
        comm.allReduce(m.data.ptr, m.data.ptr, 2, nccl.NCCL_INT32, nccl.NCCL_MAX, s)
        g = cp.zeros(3 * 2, cp.float32)
        mine = cp.full(2, r, cp.float32)  # kept alive: a temporary would be freed before NCCL reads it
        comm.allGather(mine.data.ptr, g.data.ptr, 2, nccl.NCCL_FLOAT32, s)
        rs = cp.zeros(2, cp.float32)
        src = cp.arange(6, dtype=cp.float32)
        comm.reduceScatter(src.data.ptr, rs.data.ptr, 2, nccl.NCCL_FLOAT32,
                           nccl.NCCL_SUM, s)
        return x.get().tolist(), b.get().tolist(), m.get().tolist(), g.get().tolist(), rs.get().tolist()

    got = _ranks(3, fn, devices=[0, 1, 0])
    for r, (x, b, m, g, rs) in enumerate(got):
        assert x == [6.0] * 5 and b == [0.0, 2.0, 4.0] and m == [2, 0]
        assert g == [0, 0, 1, 1, 2, 2] and rs == [3 * (2 * r), 3 * (2 * r + 1)]


def test_nccl_ranks_that_disagree_fail_everywhere():
    def fn(r, comm):
        x = cp.zeros(4, cp.float32)
        if r == 0:
            comm.allReduce(x.data.ptr, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        else:
            comm.bcast(x.data.ptr, 4, nccl.NCCL_FLOAT32, 0, 0)

    with pytest.raises(nccl.NcclError, match=r"rank 0 called allReduce\(count 4.*rank 1 called broadcast"):
        _ranks(2, fn)


def test_nccl_checks_ids_buffers_and_streams():
    with pytest.raises(TypeError, match="128 bytes"):
        nccl.NcclCommunicator(1, (1, 2, 3), 0)
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    with cp.cuda.Device(1):
        other = cp.zeros(4, cp.float32)
    with pytest.raises(nccl.NcclError, match="on device 1 but this communicator is on device 0"):
        comm.allReduce(other.data.ptr, other.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    host = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="not inside a device allocation"):
        comm.allReduce(host.ctypes.data, host.ctypes.data, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    x = cp.zeros(4, cp.float32)
    with pytest.raises(TypeError, match="stream pointer"):
        comm.allReduce(x.data.ptr, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, cp.cuda.Stream())


def test_nccl_init_all_and_groups_from_one_thread():
    comms = nccl.NcclCommunicator.initAll([0, 1])
    bufs = []
    for i, comm in enumerate(comms):
        with cp.cuda.Device(comm.device_id()):
            bufs.append(cp.full(3, 10.0 * (i + 1), cp.float32))
    nccl.groupStart()  # one thread drives both ranks: without the group this would wait forever
    for comm, b in zip(comms, bufs):
        comm.allReduce(b.data.ptr, b.data.ptr, 3, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    nccl.groupEnd()
    assert [b.get().tolist() for b in bufs] == [[30.0] * 3] * 2
    assert [c.rank_id() for c in comms] == [0, 1] and [c.device_id() for c in comms] == [0, 1]


_RANK_SCRIPT = """
import sys
import caffe, cupy
from cupy.cuda import nccl
assert cupy.__caffe_standin__
uid, rank = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
cupy.cuda.Device(rank).use()
comm = nccl.NcclCommunicator(2, uid, rank)
x = cupy.full(4, rank + 1.0, dtype=cupy.float32)
comm.allReduce(x.data.ptr, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, cupy.cuda.get_current_stream().ptr)
print(x.get().tolist())
"""


def test_nccl_between_processes_and_the_env_switch(tmp_path):
    import os
    env = dict(os.environ, CAFFE_CUPY_STANDIN="1")
    uid = nccl.get_unique_id().hex()
    procs = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, uid, str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "[3.0, 3.0, 3.0, 3.0]"


def test_install_refuses_after_the_real_cupy_and_reports_itself():
    code = ("import sys, types\n"
            "sys.modules['cupy'] = types.ModuleType('cupy')\n"
            "from caffe.blob import _standin\n"
            "try:\n"
            "    _standin.install()\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused: CAFFE_CUPY_STANDIN: the real CuPy" in out.stdout, out.stderr
    code = ("import caffe\nfrom caffe.blob import context\n"
            "print(context.gpu_available(), context.device_kernels_available(), context.cupy_standin())\n"
            "print(context.device_query())")
    import os
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, CAFFE_CUPY_STANDIN="1"))
    assert out.stdout.startswith("True False True") and "NOT a GPU" in out.stdout, out.stderr
