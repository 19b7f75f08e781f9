"""convert_mnist_siamese_data: MNIST's IDX files -> a database of random image pairs for a siamese net
(Caffe's examples/siamese/convert_mnist_siamese_data.cpp).

One record per input image, key '%08d' of the record index: a raw Datum {channels 2 (the two images of
the pair, one per channel), height rows, width cols, data = image i's bytes then image j's, label 1 when
both images show the same digit, else 0}, i and j drawn at random. As Caffe, LevelDB by default (what
examples/siamese/mnist_siamese_train_test.prototxt reads); --backend=lmdb writes LMDB. The pairs are
random each run unless --seed is given.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.cli.convert_mnist_data import read_idx_images, read_idx_labels
from caffe.cli.main import CliError, GflagsParser, usage_error

log = logging.getLogger("caffe")

USAGE = """This script converts the MNIST dataset to the leveldb format used
by caffe to train a siamese network.
Usage:
    convert_mnist_siamese_data [FLAGS] input_image_file input_label_file output_db_file
The input files may be gzipped or not."""


def pair_indices(num: int, rng: np.random.Generator) -> np.ndarray:
    """(num, 2) random image indices, one pair per record (Caffe draws i, j = rand() % num)."""
    return rng.integers(0, num, size=(num, 2)) if num else np.zeros((0, 2), dtype=np.int64)


def convert_dataset(image_file: str, label_file: str, db_path: str, backend: str = "leveldb",
                    seed: int | None = None) -> int:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    images = read_idx_images(image_file)
    labels = read_idx_labels(label_file)
    if len(images) != len(labels):
        raise CliError(f"'{image_file}' holds {len(images)} images but '{label_file}' holds {len(labels)} labels")
    num, rows, cols = images.shape
    if seed is None:
        from caffe.blob import context
        rng = context.rng()
    else:
        rng = np.random.default_rng(seed)
    log.info("A total of %d items.", num)
    log.info("Rows: %d Cols: %d", rows, cols)
    datum = caffe_pb2.Datum(channels=2, height=rows, width=cols)  # one channel per image of the pair
    with DBWriter(db_path, backend, batch=1000) as writer:
        for item_id, (i, j) in enumerate(pair_indices(num, rng)):
            datum.data = images[i].tobytes() + images[j].tobytes()
            datum.label = int(labels[i] == labels[j])
            writer.put(b"%08d" % item_id, datum.SerializeToString())
    return num


def main(argv: list[str]) -> int:
    parser = GflagsParser("convert_mnist_siamese_data", USAGE)
    parser.add_flag("backend", str, "leveldb", "The backend {leveldb, lmdb} for storing the result")
    parser.add_flag("seed", int, -1, "seed for drawing the pairs (-1: a random draw each run, as Caffe)")
    ns = parser.parse(argv)
    if len(ns.args) != 3:
        raise usage_error(parser, f"expected 3 arguments, got {len(ns.args)}")
    convert_dataset(*ns.args, backend=ns.backend, seed=None if ns.seed < 0 else ns.seed)
    return 0
