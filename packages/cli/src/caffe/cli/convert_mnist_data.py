"""convert_mnist_data: MNIST's IDX image and label files -> an LMDB/LevelDB of Datums
(Caffe's examples/mnist/convert_mnist_data.cpp).

Each record: key '%08d' (ASCII) of the item index, value a raw Datum {channels 1,
height rows, width cols, data = the image bytes, label}. Input files may be gzipped.
"""
from __future__ import annotations

import gzip
import logging

import numpy as np

from caffe.cli.main import CliError, GflagsParser, usage_error

log = logging.getLogger("caffe")

IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049

USAGE = """This script converts the MNIST dataset to
the lmdb/leveldb format used by Caffe to load data.
Usage:
    convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file
The input files may be gzipped (train-images-idx3-ubyte.gz) or not."""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":  # gzip, whatever the file is called
                with gzip.open(f) as g:
                    return g.read()
            return f.read()
    except FileNotFoundError:
        raise CliError(f"cannot open '{path}': no such file") from None
    except (OSError, EOFError) as exc:
        raise CliError(f"cannot read '{path}': {exc}") from None


def _header(raw: bytes, path: str, n: int, magic: int, kind: str) -> list[int]:
    if len(raw) < 4 * n:
        raise CliError(f"'{path}' is too short ({len(raw)} bytes) to be an MNIST {kind} file")
    fields = [int(x) for x in np.frombuffer(raw, dtype=">u4", count=n)]  # big-endian, as MNIST writes
    if fields[0] != magic:
        raise CliError(f"'{path}' is not an MNIST {kind} file: magic number {fields[0]}, expected {magic}")
    return fields


def read_idx_images(path: str) -> np.ndarray:
    """An IDX3 image file as a (num, rows, cols) uint8 array."""
    raw = _read(path)
    _, num, rows, cols = _header(raw, path, 4, IMAGE_MAGIC, "image")
    need = 16 + num * rows * cols
    if len(raw) < need:
        raise CliError(f"'{path}' is truncated: {num} images of {rows}x{cols} need {need} bytes, "
                       f"the file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, count=num * rows * cols, offset=16).reshape(num, rows, cols)


def read_idx_labels(path: str) -> np.ndarray:
    """An IDX1 label file as a (num,) uint8 array."""
    raw = _read(path)
    _, num = _header(raw, path, 2, LABEL_MAGIC, "label")
    if len(raw) < 8 + num:
        raise CliError(f"'{path}' is truncated: {num} labels need {8 + num} bytes, the file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, count=num, offset=8)


def convert_dataset(image_file: str, label_file: str, db_path: str, backend: str = "lmdb") -> int:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    images = read_idx_images(image_file)
    labels = read_idx_labels(label_file)
    if len(images) != len(labels):
        raise CliError(f"'{image_file}' holds {len(images)} images but '{label_file}' holds {len(labels)} labels")
    num, rows, cols = images.shape
    log.info("A total of %d items.", num)
    log.info("Rows: %d Cols: %d", rows, cols)
    datum = caffe_pb2.Datum(channels=1, height=rows, width=cols)
    with DBWriter(db_path, backend, batch=1000) as writer:
        for item_id in range(num):
            datum.data = images[item_id].tobytes()
            datum.label = int(labels[item_id])
            writer.put(b"%08d" % item_id, datum.SerializeToString())
            if (item_id + 1) % 1000 == 0:
                log.info("Processed %d files.", item_id + 1)
    if num % 1000:
        log.info("Processed %d files.", num)
    return num


def main(argv: list[str]) -> int:
    parser = GflagsParser("convert_mnist_data", USAGE)
    parser.add_flag("backend", str, "lmdb", "The backend {lmdb, leveldb} for storing the result")
    ns = parser.parse(argv)
    if len(ns.args) != 3:
        raise usage_error(parser, f"expected 3 arguments, got {len(ns.args)}")
    convert_dataset(*ns.args, backend=ns.backend)
    return 0
