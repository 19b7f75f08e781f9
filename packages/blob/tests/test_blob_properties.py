"""Blob properties: proto round trips, reshape/capacity, sharing, axis arithmetic, pycaffe surface."""
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from caffe.blob import Blob, context
from caffe.blob.proto_io import array_to_blob_proto, blob_proto_to_array
from caffe.proto import caffe_pb2

shapes = hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5)
nonempty = hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=5)


def filled(shape, seed=0, dtype=np.float32):
    b = Blob(shape, dtype=dtype)
    rng = np.random.default_rng(seed)
    b.data[...] = rng.standard_normal(shape)
    b.diff[...] = rng.standard_normal(shape)
    return b


@given(shapes)
def test_count_and_axes(shape):
    b = Blob(shape)
    assert b.shape == tuple(shape)
    assert b.count() == int(np.prod(shape, dtype=np.int64))
    assert b.num_axes == len(shape)
    for start in range(len(shape) + 1):
        for end in range(start, len(shape) + 1):
            assert b.count(start, end) == int(np.prod(shape[start:end], dtype=np.int64))
    for axis in range(-len(shape), len(shape)):
        assert b.canonical_axis_index(axis) == axis % len(shape)
        assert b.dim(axis) == shape[axis]
    with pytest.raises(IndexError, match="out of range"):
        b.canonical_axis_index(len(shape))
    with pytest.raises(IndexError):
        b.canonical_axis_index(-len(shape) - 1)


@given(nonempty, st.data())
def test_offset_matches_numpy_ravel(shape, data):
    b = Blob(shape)
    idx = tuple(data.draw(st.integers(0, d - 1)) for d in shape)
    assert b.offset(*idx) == int(np.ravel_multi_index(idx, shape))
    assert b.offset(list(idx)) == b.offset(*idx)


def test_legacy_accessors():
    b = Blob(2, 3, 4, 5)
    assert (b.num, b.channels, b.height, b.width) == (2, 3, 4, 5)
    b.reshape(7, 8)
    assert (b.num, b.channels, b.height, b.width) == (7, 8, 1, 1)
    b.reshape([1] * 5)
    with pytest.raises(ValueError, match="legacy"):
        b.num


@given(nonempty, nonempty)
def test_reshape_grows_capacity_and_never_reallocates_when_shrinking(a, c):
    b = Blob(a)
    b.data[...] = 1
    mem = b.data_mem
    cap = b.capacity
    b.reshape(c)
    n = int(np.prod(c))
    if n <= cap:
        assert b.data_mem is mem and b.capacity == cap
    else:
        assert b.data_mem is not mem and b.capacity == n
    assert b.data.shape == tuple(c)


def test_too_many_axes_and_negative_dims():
    with pytest.raises(ValueError, match="32"):
        Blob([1] * 33)
    with pytest.raises(ValueError, match="negative"):
        Blob(2, -1)


@given(nonempty, st.integers(0, 2**16), st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_proto_round_trip(shape, seed, write_diff, dtype):
    b = filled(shape, seed, dtype)
    proto = b.to_proto(write_diff)
    assert tuple(proto.shape.dim) == tuple(shape)
    assert len(proto.double_data if dtype == np.float64 else proto.data) == b.count()
    wire = caffe_pb2.BlobProto.FromString(proto.SerializeToString())
    c = Blob(dtype=dtype)
    c.from_proto(wire)
    assert c.shape == b.shape
    np.testing.assert_array_equal(c.data, b.data)
    if write_diff:
        np.testing.assert_array_equal(c.diff, b.diff)


def test_legacy_4d_proto_and_float_double():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3)
    proto.double_data.extend(np.arange(6.0))
    b = Blob()
    b.from_proto(proto)
    assert b.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6, dtype=np.float32))
    assert b.shape_equals(proto)


def test_from_proto_shape_mismatch_names_both_shapes():
    b = Blob(2, 3)
    proto = array_to_blob_proto(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(2, 3\)"):
        b.from_proto(proto, reshape=False)


def test_proto_with_wrong_data_length_is_refused():
    proto = caffe_pb2.BlobProto()
    proto.shape.dim.extend([2, 2])
    proto.data.extend([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="3 values.*4"):
        Blob().from_proto(proto)


@given(hnp.arrays(np.float32, nonempty, elements=st.floats(-1e6, 1e6, width=32)))
def test_array_proto_helpers_round_trip(arr):
    np.testing.assert_array_equal(blob_proto_to_array(array_to_blob_proto(arr)), arr)


def test_packed_write_is_fast_path_equivalent():
    arr = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    slow = caffe_pb2.BlobProto()
    slow.shape.dim.append(1000)
    slow.data.extend(arr.tolist())
    assert array_to_blob_proto(arr).SerializeToString() == slow.SerializeToString()


@given(nonempty, st.integers(0, 1000))
def test_update_and_reductions(shape, seed):
    b = filled(shape, seed, np.float64)
    data, diff = b.data.copy(), b.diff.copy()
    assert b.asum_data() == pytest.approx(np.abs(data).sum())
    assert b.asum_diff() == pytest.approx(np.abs(diff).sum())
    assert b.sumsq_data() == pytest.approx((data ** 2).sum())
    assert b.sumsq_diff() == pytest.approx((diff ** 2).sum())
    b.update()
    np.testing.assert_allclose(b.data, data - diff)
    b.scale_data(2.0)
    b.scale_diff(-0.5)
    np.testing.assert_allclose(b.data, 2 * (data - diff))
    np.testing.assert_allclose(b.diff, -0.5 * diff)


def test_reductions_of_untouched_blob_are_zero_and_do_not_allocate():
    b = Blob(3, 3)
    assert b.asum_data() == 0 and b.sumsq_diff() == 0
    assert b.data_mem.head == 0


@given(nonempty)
def test_share_data_and_diff(shape):
    a, b = filled(shape, 1), Blob(shape)
    b.share_data(a)
    b.share_diff(a)
    a.data[...] = 7
    a.diff[...] = 3
    assert np.all(b.data == 7) and np.all(b.diff == 3)
    c = Blob([int(np.prod(shape)) + 1])
    with pytest.raises(ValueError, match="count"):
        c.share_data(a)
    d = Blob(shape, dtype=np.float64)  # same count, other dtype: its bytes would be read as float32
    with pytest.raises(ValueError, match="dtype mismatch: float64 vs float32"):
        d.share_data(a)
    with pytest.raises(ValueError, match="dtype mismatch: float64 vs float32"):
        d.share_diff(a)


def test_copy_from_with_and_without_reshape():
    a = filled((2, 3), 4)
    b = Blob(3, 2)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        b.copy_from(a)
    b.copy_from(a, reshape=True)
    np.testing.assert_array_equal(b.data, a.data)
    b.copy_from(a, copy_diff=True)
    np.testing.assert_array_equal(b.diff, a.diff)
    assert not np.shares_memory(b.data, a.data)


def test_pycaffe_surface_views_are_writable_and_shaped():
    b = Blob(2, 3)
    b.data[0, 1] = 5
    assert b.cpu_data()[0, 1] == 5
    b.reshape(3, 2)
    assert b.data.shape == (3, 2)
    assert b.data.flags.writeable and not b.cpu_data().flags.writeable
    b.data = np.ones((3, 2))
    assert b.data.sum() == 6


def test_runtime_context_is_per_thread_and_seeds_reproduce():
    context.set_random_seed(1701)
    first = context.rng().random(5)
    context.set_random_seed(1701)
    np.testing.assert_array_equal(context.rng().random(5), first)
    context.set_solver_count(4)
    context.set_solver_rank(2)
    seen = {}

    def worker(state):
        seen["fresh"] = (context.solver_count(), context.solver_rank())
        context.install(state)
        seen["installed"] = (context.solver_count(), context.solver_rank(), context.root_solver())

    t = threading.Thread(target=worker, args=(context.capture(),))
    t.start()
    t.join()
    assert seen["fresh"] == (1, 0)  # a new thread starts with a fresh context, as in Caffe
    assert seen["installed"] == (4, 2, False)
    context.set_solver_count(1)
    context.set_solver_rank(0)
    assert context.root_solver()


def test_device_query_without_gpu_says_so():
    if context.gpu_available():
        assert "Device id" in context.device_query()
    else:
        assert context.device_query().startswith("No GPU available")
