"""Time writing and reading a CaffeNet-size caffemodel (about 61M float parameters, 233 MB).

    python packages/net/bench/bench_weights.py [--dir /tmp]

Reports Net.save (streamed binary caffemodel, atomic with fsync), the naive route
for comparison (ToProto with blob.data.extend, then SerializeToString), Net.copy_from
of the binary file, and save_hdf5 / load_hdf5.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[3].parent / "shared" / "caffe-models" / "models" / \
    "bvlc_reference_caffenet" / "deploy.prototxt"


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def naive_serialize(net) -> bytes:
    """What a straightforward port would do: fill each BlobProto element-wise, serialize the whole message."""
    from caffe.proto import caffe_pb2
    param = caffe_pb2.NetParameter(name=net.name)
    for layer in net.layers:
        lp = param.layer.add()
        lp.CopyFrom(layer.layer_param)
        for blob in layer.blobs:
            bp = lp.blobs.add()
            bp.shape.dim.extend(blob.shape)
            bp.data.extend(blob.data.ravel())
    return param.SerializeToString()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temporary directory)")
    ap.add_argument("--skip-naive", action="store_true")
    args = ap.parse_args()
    if not DEPLOY.exists():
        print(f"skipped: {DEPLOY} is absent")
        return 0
    import numpy as np
    import caffe
    net = caffe.Net(str(DEPLOY), caffe.TEST)
    n_params = sum(b.count() for b in net.learnable_params)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        model = os.path.join(tmp, "caffenet.caffemodel")
        h5 = os.path.join(tmp, "caffenet.h5")
        save_s = timed(lambda: net.save(model))
        size_mb = os.path.getsize(model) / 2**20
        other = caffe.Net(str(DEPLOY), caffe.TEST)
        load_s = timed(lambda: other.copy_from(model))
        assert all(np.array_equal(a.data, b.data) for a, b in zip(net.learnable_params, other.learnable_params))
        h5_save_s = timed(lambda: net.save_hdf5(h5))
        h5_load_s = timed(lambda: other.load_hdf5(h5))
        naive_s = None if args.skip_naive else timed(lambda: naive_serialize(net))
    print(f"CaffeNet: {n_params / 1e6:.1f}M parameters, caffemodel {size_mb:.1f} MB")
    print(f"  Net.save (streamed, atomic, fsync)   {save_s:6.2f} s")
    if naive_s is not None:
        print(f"  naive ToProto + extend + serialize  {naive_s:6.2f} s  (not written to disk)")
    print(f"  Net.copy_from (binary)              {load_s:6.2f} s")
    print(f"  Net.save_hdf5                       {h5_save_s:6.2f} s")
    print(f"  Net.load_hdf5                       {h5_load_s:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
