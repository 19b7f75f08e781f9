"""convert_mnist_data: MNIST's IDX image and label files -> an LMDB/LevelDB of Datums
(Caffe's examples/mnist/convert_mnist_data.cpp).

Each record: key '%08d' (ASCII) of the item index, value a raw Datum {channels 1,
height rows, width cols, data = the image bytes, label}. Input files may be gzipped.
"""
from __future__ import annotations

import gzip
import logging
import os

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


# Deflate cannot expand data more than ~1032:1: what a header asks beyond that is not in the file.
_MAX_GZIP_RATIO = 1032


def _read_idx(path: str, n_header: int, magic: int, kind: str, item_bytes, describe) -> tuple[list[int], bytes]:
    """(header fields, payload) of an IDX file, gzipped or not. What is read is bounded by what the header
    declares, and that by what the file can hold: an endless stream or a gzip bomb is refused, not read."""
    from caffe.blob.fileio import FileInputError, open_regular_file
    if not os.path.exists(path):
        raise CliError(f"cannot open '{path}': no such file")
    try:
        f, size = open_regular_file(path, f"MNIST {kind} file")
    except FileInputError as exc:
        raise CliError(str(exc)) from None
    with f:
        try:
            gz = f.read(2) == b"\x1f\x8b"  # gzip, whatever the file is called
            f.seek(0)
            stream = gzip.GzipFile(fileobj=f) if gz else f
            capacity = size * _MAX_GZIP_RATIO if gz else size
            head = stream.read(4 * n_header)
            fields = _header(head, path, n_header, magic, kind)
            need = item_bytes(fields)
            total = 4 * n_header + need
            if total > capacity:
                holds = f"a {size}-byte gzip file can hold at most {capacity}" if gz else f"the file has {size}"
                raise CliError(f"'{path}' is truncated: {describe(fields)} need {total} bytes, {holds}")
            payload = stream.read(need)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise CliError(f"cannot read '{path}': {exc}") from None
    if len(payload) < need:
        raise CliError(f"'{path}' is truncated: {describe(fields)} need {total} bytes, the file has "
                       f"{4 * n_header + len(payload)}{' once decompressed' if gz else ''}")
    return fields, payload


def _header(raw: bytes, path: str, n: int, magic: int, kind: str) -> list[int]:
    if len(raw) < 4 * n:
        raise CliError(f"'{path}' is too short ({len(raw)} bytes) to be an MNIST {kind} file")
    fields = [int(x) for x in np.frombuffer(raw, dtype=">u4", count=n)]  # big-endian, as MNIST writes
    if fields[0] != magic:
        raise CliError(f"'{path}' is not an MNIST {kind} file: magic number {fields[0]}, expected {magic}")
    return fields


def read_idx_images(path: str) -> np.ndarray:
    """An IDX3 image file as a (num, rows, cols) uint8 array."""
    (_, num, rows, cols), raw = _read_idx(path, 4, IMAGE_MAGIC, "image", lambda h: h[1] * h[2] * h[3],
                                          lambda h: f"{h[1]} images of {h[2]}x{h[3]}")
    return np.frombuffer(raw, dtype=np.uint8, count=num * rows * cols).reshape(num, rows, cols)


def read_idx_labels(path: str) -> np.ndarray:
    """An IDX1 label file as a (num,) uint8 array."""
    (_, num), raw = _read_idx(path, 2, LABEL_MAGIC, "label", lambda h: h[1], lambda h: f"{h[1]} labels")
    return np.frombuffer(raw, dtype=np.uint8, count=num)


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
