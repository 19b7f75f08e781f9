#!/usr/bin/env python3
"""Data-layer throughput: images/s delivered into the top blobs by the Data layer (LMDB + prefetch thread).

Two databases, built in a temporary folder:
  * digits: the real MNIST subset shipped in data/mnist (4,000 raw 1x28x28 Datums, via convert_mnist_data);
  * jpeg: a few hundred 3x256x256 encoded-JPEG Datums (smooth random pictures, quality 90).
For each, a few transform settings (none; scale; crop + mirror + mean in TRAIN). Two figures per setting:
  * "alone": Forward in a tight loop, so the data path is the only work (its ceiling);
  * "beside compute": the main thread computes between Forwards (one-thread BLAS matrix products, which
    release the GIL, sized to twice the time a batch takes to load alone), and we report the rate and the
    time Forward spent waiting for data: the prefetch thread hides the loading behind the compute, so the
    wait should be near zero.
  * "CPU ms/img": process CPU time per image in the "alone" run, a figure the machine's other load does not
    change much: 2 idle cores deliver about 2000 / (CPU ms/img) images/s.

    python bench/data_throughput.py [--seconds 3] [--jpeg-images 300]
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import sys
import tempfile
import time

# The stand-in "net compute" below is BLAS on one thread: OpenBLAS's spinning worker threads would
# otherwise fight the prefetch thread for the 2 cores and measure that fight instead of the overlap.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_digits(tmp: str) -> str:
    from caffe.cli.convert_mnist_data import convert_dataset
    logging_off()
    path = os.path.join(tmp, "digits_lmdb")
    convert_dataset(os.path.join(ROOT, "data/mnist/train-images-idx3-ubyte.gz"),
                    os.path.join(ROOT, "data/mnist/train-labels-idx1-ubyte.gz"), path)
    return path


def build_jpeg(tmp: str, n: int) -> str:
    from PIL import Image
    from caffe.layers.db import write_db
    from caffe.proto import caffe_pb2
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256] / 256.0
    records = []
    for i in range(n):
        f = rng.uniform(1, 6, size=(3, 2))
        ph = rng.uniform(0, 6.3, size=3)
        img = np.stack([np.sin(f[c, 0] * 6.3 * xx + f[c, 1] * 6.3 * yy + ph[c]) for c in range(3)], -1)
        img = ((img + 1) * 110 + rng.normal(0, 12, size=img.shape)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        d = caffe_pb2.Datum(encoded=True, data=buf.getvalue(), label=i % 10)
        records.append((f"{i:08d}", d.SerializeToString()))
    path = os.path.join(tmp, "jpeg_lmdb")
    write_db(path, records)
    return path


def logging_off():
    import logging
    logging.getLogger("caffe").setLevel(logging.WARNING)


def make_layer(source: str, batch: int, transform: str, phase: int):
    from caffe.blob import Blob
    from caffe.layers.testing import make_layer as mk
    layer = mk("Data", f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }} {transform}',
               phase=phase)
    top = [Blob(), Blob()]
    layer.SetUp([], top)
    return layer, top


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_alone(source, batch, transform, phase, seconds):
    """(images/s, CPU ms per image): the CPU cost is what the figure would be on idle cores."""
    layer, top = make_layer(source, batch, transform, phase)
    layer.Forward([], top)  # warm up: the queue fills
    n, t0, c0 = 0, time.perf_counter(), cpu_seconds()
    while time.perf_counter() - t0 < seconds:
        layer.Forward([], top)
        n += batch
    rate = n / (time.perf_counter() - t0)
    cpu_ms = 1000 * (cpu_seconds() - c0) / n
    layer.close()
    return rate, cpu_ms


def run_beside_compute(source, batch, transform, phase, seconds, compute_s):
    """Main thread computes ~compute_s per batch (GIL-free matmuls); returns (images/s, mean wait ms)."""
    a = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    reps = max(1, calibrate_matmul(a, compute_s))
    layer, top = make_layer(source, batch, transform, phase)
    layer.Forward([], top)
    time.sleep(0.2)
    n, waited, steps, t0 = 0, 0.0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        layer.Forward([], top)
        waited += time.perf_counter() - w0
        for _ in range(reps):
            a @ a
        n += batch
        steps += 1
    rate = n / (time.perf_counter() - t0)
    layer.close()
    return rate, 1000 * waited / steps


def calibrate_matmul(a, target_s):
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    per = (time.perf_counter() - t0) / 20
    return int(target_s / per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    ap.add_argument("--jpeg-images", type=int, default=300, help="images in the JPEG database")
    args = ap.parse_args(argv)
    logging_off()
    print(f"machine: {os.cpu_count()} cores; numpy {np.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        digits = build_digits(tmp)
        jpeg = build_jpeg(tmp, args.jpeg_images)
        cases = [
            ("digits 1x28x28 raw", digits, 64, "", 0),
            ("digits, scale 1/256", digits, 64, "transform_param { scale: 0.00390625 }", 0),
            ("digits, crop 24 + mirror + scale", digits, 64,
             "transform_param { crop_size: 24 mirror: true scale: 0.00390625 }", 0),
            ("jpeg 3x256x256, no transform", jpeg, 50, "", 0),
            ("jpeg, crop 227 + mirror + mean (TRAIN)", jpeg, 50,
             "transform_param { crop_size: 227 mirror: true mean_value: 104 mean_value: 117 "
             "mean_value: 123 }", 0),
        ]
        print(f"load average {os.getloadavg()[0]:.1f} (other work on the machine takes cores too)")
        print(f"{'case':40s} {'alone img/s':>11s} {'CPU ms/img':>10s} {'beside compute img/s':>20s} "
              f"{'compute ms':>10s} {'Forward wait ms':>15s}")
        for name, src, batch, transform, phase in cases:
            alone, cpu_ms = run_alone(src, batch, transform, phase, args.seconds)
            compute_s = 2 * batch / alone  # a net that takes twice what loading a batch takes alone
            beside, wait = run_beside_compute(src, batch, transform, phase, args.seconds, compute_s)
            print(f"{name:40s} {alone:11,.0f} {cpu_ms:10.3f} {beside:20,.0f} {1000 * compute_s:10.2f} "
                  f"{wait:15.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
