"""convert_cifar_data: CIFAR-10's binary batches -> train and test databases of Datums
(Caffe's examples/cifar10/convert_cifar_data.cpp).

    caffe-cli convert_cifar_data INPUT_FOLDER OUTPUT_FOLDER [lmdb|leveldb]

INPUT_FOLDER holds the binary version of CIFAR-10 (cifar-10-batches-bin): data_batch_1.bin ..
data_batch_5.bin and test_batch.bin, each a run of 3,073-byte records (a label byte, then the 32x32
image as 1,024 red, 1,024 green, 1,024 blue bytes). Writes OUTPUT_FOLDER/cifar10_train_<db> (the five
training batches in order) and OUTPUT_FOLDER/cifar10_test_<db>: one raw Datum {channels 3, height 32,
width 32, data = the image bytes, label} per record, keyed '%05d' by its index (Caffe's keys for the
real 10,000-image batches). Files of any whole number of records are read.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from caffe.cli.main import CliError, GflagsParser, usage_error

log = logging.getLogger("caffe")

SIZE = 32
IMAGE_BYTES = 3 * SIZE * SIZE
RECORD_BYTES = 1 + IMAGE_BYTES
TRAIN_BATCHES = 5

USAGE = """This script converts the CIFAR dataset to the lmdb/leveldb format used
by caffe to perform classification.
Usage:
    convert_cifar_data input_folder output_folder [db_type]
Where the input folder should contain the binary batch files (db_type: lmdb, the default, or leveldb).
The CIFAR dataset could be downloaded at
    http://www.cs.toronto.edu/~kriz/cifar.html
You should gunzip them after downloading."""


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-10 binary batch as (labels (n,) uint8, images (n, 3072) uint8)."""
    from caffe.blob.fileio import FileInputError, read_regular_file
    if not os.path.exists(path):
        raise CliError(f"cannot open '{path}': no such file (the input folder must hold CIFAR-10's binary "
                       f"version: data_batch_1.bin .. data_batch_5.bin, test_batch.bin)")
    try:
        raw = read_regular_file(path, "CIFAR-10 batch")  # a regular file only: no FIFO, no endless stream
    except FileInputError as exc:
        raise CliError(f"cannot read '{path}': {exc.reason}") from None
    if not raw or len(raw) % RECORD_BYTES:
        raise CliError(f"'{path}' is not a CIFAR-10 binary batch: {len(raw)} bytes is not a whole number of "
                       f"{RECORD_BYTES}-byte records (a label byte and a 3x32x32 image)")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    return records[:, 0], records[:, 1:]


def _write(db_path: str, backend: str, batches) -> int:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    datum = caffe_pb2.Datum(channels=3, height=SIZE, width=SIZE)
    index = 0
    with DBWriter(db_path, backend, batch=1000) as writer:
        for labels, images in batches:
            for label, image in zip(labels, images):
                datum.label = int(label)
                datum.data = image.tobytes()
                writer.put(b"%05d" % index, datum.SerializeToString())
                index += 1
    return index


def convert_dataset(input_folder: str, output_folder: str, db_type: str = "lmdb") -> tuple[int, int]:
    """Returns (training records, test records)."""
    if db_type not in ("lmdb", "leveldb"):
        raise CliError(f"db_type '{db_type}': expected lmdb or leveldb")
    if not os.path.isdir(input_folder):
        raise CliError(f"input folder '{input_folder}' does not exist")
    # read every input first: a bad file fails before any database is written
    train = []
    for file_id in range(1, TRAIN_BATCHES + 1):
        train.append(read_batch(os.path.join(input_folder, f"data_batch_{file_id}.bin")))
    test = read_batch(os.path.join(input_folder, "test_batch.bin"))
    log.info("Writing Training data")
    for file_id, (labels, _) in enumerate(train, 1):
        log.info("Training Batch %d (%d images)", file_id, len(labels))
    n_train = _write(os.path.join(output_folder, f"cifar10_train_{db_type}"), db_type, train)
    log.info("Writing Testing data")
    n_test = _write(os.path.join(output_folder, f"cifar10_test_{db_type}"), db_type, [test])
    log.info("Wrote %d training and %d test images", n_train, n_test)
    return n_train, n_test


def main(argv: list[str]) -> int:
    parser = GflagsParser("convert_cifar_data", USAGE)
    ns = parser.parse(argv)
    if len(ns.args) not in (2, 3):
        raise usage_error(parser, f"expected 2 or 3 arguments, got {len(ns.args)}")
    convert_dataset(*ns.args)
    return 0
