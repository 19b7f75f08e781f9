"""Caffe's contiguous parameter layout: every learnable blob borrows a slice of one data and one diff buffer."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, strategies as st

from caffe.blob import Blob
from caffe.parallel import ParallelError, ParamBuffers

shapes = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=6)


def _blobs(shape_list, dtype, seed):
    rng = np.random.default_rng(seed)
    blobs = []
    for shape in shape_list:
        b = Blob(*shape, dtype=dtype)
        b.data[...] = rng.standard_normal(shape)
        b.diff[...] = rng.standard_normal(shape)
        blobs.append(b)
    return blobs


@given(shape_list=shapes, dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**31))
def test_blobs_borrow_their_slices(shape_list, dtype, seed):
    blobs = _blobs(shape_list, dtype, seed)
    before = [(b.data.copy(), b.diff.copy()) for b in blobs]
    buf = ParamBuffers(blobs)
    assert buf.data.dtype == np.dtype(dtype) and buf.size == sum(b.count() for b in blobs)
    # the values moved in unchanged, one blob after the other in order
    np.testing.assert_array_equal(buf.data, np.concatenate([d.ravel() for d, _ in before]))
    np.testing.assert_array_equal(buf.diff, np.concatenate([g.ravel() for _, g in before]))
    for b, off in zip(blobs, buf.offsets):
        n = b.count()
        # the blob IS its slice: writes through either side show on the other
        assert np.shares_memory(b.data, buf.data) and np.shares_memory(b.diff, buf.diff)
        buf.diff[off:off + n] += 1
        np.testing.assert_array_equal(b.diff.ravel(), buf.diff[off:off + n])
        b.mutable_cpu_data()[...] = 7
        assert (buf.data[off:off + n] == 7).all()
        assert buf.slice_of(b) == slice(off, off + n)
    # one in-place operation on the whole buffer reaches every blob (what a single allreduce relies on)
    buf.diff *= 0.5
    buf.data[:] = np.arange(buf.size)
    for b, off in zip(blobs, buf.offsets):
        np.testing.assert_array_equal(b.cpu_data().ravel(), np.arange(off, off + b.count()))
        b.update()  # Blob.update writes into the shared data buffer
    buf.verify()


def test_update_and_clear_diffs_act_on_the_buffers():
    blobs = _blobs([[2, 3], [4]], np.float32, 0)
    buf = ParamBuffers(blobs)
    buf.diff[:] = 1
    for b in blobs:
        b.update()
    data_after = buf.data.copy()
    for b in blobs:
        b.mutable_cpu_diff()[...] = 0  # what ClearParamDiffs does
    assert not buf.diff.any()
    np.testing.assert_array_equal(np.concatenate([b.cpu_data().ravel() for b in blobs]), data_after)


def test_a_reallocated_blob_is_detected():
    blobs = _blobs([[2, 3], [4]], np.float32, 1)
    buf = ParamBuffers(blobs)
    blobs[1].reshape(10)  # grows: new memory, outside the buffer
    with pytest.raises(ParallelError, match=r"parameter 1 changed shape"):
        buf.verify()
    blobs = _blobs([[2, 3], [4]], np.float32, 1)
    buf = ParamBuffers(blobs)
    blobs[0].share_diff(Blob(2, 3))  # re-shared after the buffers were built
    with pytest.raises(ParallelError, match=r"parameter 0 .* no longer uses the shared diff buffer"):
        buf.verify()


def test_bad_parameter_lists():
    with pytest.raises(ParallelError, match="no learnable parameters"):
        ParamBuffers([])
    with pytest.raises(ParallelError, match="mix dtypes"):
        ParamBuffers([Blob(2, dtype=np.float32), Blob(2, dtype=np.float64)])


def test_layer_slices_follow_the_layers():
    blobs = _blobs([[3, 2], [3], [2, 2], [2]], np.float32, 2)
    buf = ParamBuffers(blobs)
    layer = SimpleNamespace
    net = SimpleNamespace(layers=[layer(blobs=[]), layer(blobs=blobs[:2]), layer(blobs=[]), layer(blobs=blobs[2:])])
    assert buf.layer_slices(net) == [None, slice(0, 9), None, slice(9, 15)]
    # a layer holding a blob outside learnable_params (a shared, non-owner parameter): no layer-wise reduce
    shared = Blob(3, 2)
    shared.share_data(blobs[0])
    net.layers.append(layer(blobs=[shared]))
    assert buf.layer_slices(net) is None
