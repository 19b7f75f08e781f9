"""The NCCL path (GPUs). Skipped cleanly without a GPU and CuPy's NCCL bindings (the `nccl` extra)."""
import argparse
import os

import numpy as np
import pytest

from caffe.blob import context
from caffe.parallel import has_nccl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not context.gpu_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not has_nccl(), reason="needs CuPy's NCCL bindings: pip install 'caffe-parallel[nccl]'"),
]


def args(iters=3, snapshot=0):
    return argparse.Namespace(type="SGD", momentum=0.9, weight_decay=0.01, iters=iters, snapshot=snapshot,
                              whole_reduce=False, python_layer="none")


@pytest.fixture
def gpu():
    context.set_mode_gpu()
    context.set_device(0)
    yield
    context.set_mode_cpu()
    context.set_solver_count(1)
    context.set_solver_rank(0)
    context.set_multiprocess(False)


def test_buffers_live_on_the_device(gpu):
    import cupy
    from caffe.blob import Blob
    from caffe.parallel import ParamBuffers
    blobs = [Blob(2, 3), Blob(4)]
    for i, b in enumerate(blobs):
        b.data[...] = i + 1
    buf = ParamBuffers(blobs, xp=cupy)
    assert isinstance(buf.data, cupy.ndarray)
    for b, off in zip(blobs, buf.offsets):
        assert b.gpu_data().data.ptr == buf.data[off:].data.ptr
        assert b.gpu_diff().data.ptr == buf.diff[off:].data.ptr
    np.testing.assert_array_equal(cupy.asnumpy(buf.data), [1] * 6 + [2] * 4)
    buf.verify()


def test_one_rank_nccl_training_equals_plain_gpu_training(gpu, tmp_path):
    # one rank: the allreduce and bcast are identities, but everything else of the NCCL path runs
    import caffe.solver
    from caffe.parallel import NCCL, selftest
    db = str(tmp_path / "db")
    selftest.write_db(db, 12)
    path = selftest.write_solver(str(tmp_path), "g", db, 2, args())
    plain = caffe.solver.get_solver(path)
    start = [b.data.copy() for b in plain.net.learnable_params]
    plain.step(3)
    selftest.collect_dropped_databases()
    s = caffe.solver.get_solver(path)
    for b, x in zip(s.net.learnable_params, start):
        b.data[...] = x
    nccl = NCCL(s, NCCL.new_uid())
    nccl.bcast()
    s.add_callback(nccl)
    s.net.after_backward(nccl)
    s.step(3)
    for a, b in zip(plain.net.learnable_params, s.net.learnable_params):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(context.gpu_count() < 2, reason="needs two GPUs")
def test_two_gpus_match_one_gpu_with_twice_the_batch(tmp_path):
    import caffe.solver
    from caffe.blob.proto_io import blob_proto_to_array
    from caffe.parallel import launch, selftest
    from caffe.proto import caffe_pb2
    db = str(tmp_path / "db")
    selftest.write_db(db, 2 * 2 * 2 + 1)
    iters = 3
    path = selftest.write_solver(str(tmp_path), "ranks", db, 2, args(iters, snapshot=iters))
    launch.train_multi_gpu(path, "0,1")
    model = caffe_pb2.NetParameter()
    with open(os.path.join(str(tmp_path), f"snap_iter_{iters}.caffemodel"), "rb") as f:
        model.ParseFromString(f.read())
    trained = [blob_proto_to_array(b) for layer in model.layer for b in layer.blobs]
    # one GPU with batch 4 from rank 0's initial weights (random_seed + rank 0 = the same fillers)
    context.set_mode_gpu()
    context.set_device(0)
    try:
        ref = caffe.solver.get_solver(selftest.write_solver(str(tmp_path), "single", db, 4, args(iters)))
        ref.step(iters)
        for b, t in zip(ref.net.learnable_params, trained):
            np.testing.assert_allclose(b.data, t.reshape(b.shape), rtol=1e-4, atol=2e-5)
    finally:
        context.set_mode_cpu()
