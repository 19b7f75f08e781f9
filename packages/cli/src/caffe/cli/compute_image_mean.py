"""compute_image_mean: the mean image of a database of Datums (Caffe's tools/compute_image_mean.cpp).

    caffe-cli compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]

Writes a BlobProto (num 1, channels, height, width; float data) that transform_param
mean_file reads, and logs the mean of each channel. Encoded Datums are decoded; every
record must have the first one's size. Sums are kept in float64 (Caffe sums in float,
which rounds once the totals pass 2^24).
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.cli.main import CliError, GflagsParser, usage_error

log = logging.getLogger("caffe")

USAGE = """Compute the mean_image of a set of images given by a leveldb/lmdb
Usage:
    compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]"""


def write_binary_atomically(path: str, payload: bytes) -> None:
    """Write a file atomically, with the mode any new file gets (caffe.blob.fileio: umask, fsync, rename)."""
    from caffe.blob.fileio import atomic_write_bytes
    atomic_write_bytes(path, payload, "output file")


def compute_mean(db_path: str, backend: str = "lmdb") -> np.ndarray:
    """The (C, H, W) float64 mean of every Datum in a database."""
    from caffe.layers.data_transformer import DataError, datum_to_image, parse_datum
    from caffe.layers.db import open_db
    kind = "LMDB" if backend.lower() == "lmdb" else "LevelDB"
    total = None
    count = 0
    log.info("Starting iteration")
    with open_db(db_path, backend) as db:
        for key, value in db.items():
            where = f"record '{key.decode('ascii', 'replace')}' of {kind} '{db_path}'"
            img = datum_to_image(parse_datum(value, where), where=where)
            if total is None:
                total = np.zeros(img.shape, dtype=np.float64)
            elif img.shape != total.shape:
                c, h, w = total.shape
                raise DataError(f"{where} is {'x'.join(map(str, img.shape))} but the first record is "
                                f"{c}x{h}x{w}: incorrect data field size {img.size}, expected {total.size}")
            total += img
            count += 1
            if count % 10000 == 0:
                log.info("Processed %d files.", count)
    if count % 10000:
        log.info("Processed %d files.", count)
    return total / count


def mean_to_proto(mean: np.ndarray):
    from caffe.blob.proto_io import packed_field
    from caffe.proto import caffe_pb2
    c, h, w = mean.shape
    proto = caffe_pb2.BlobProto(num=1, channels=c, height=h, width=w)  # legacy 4-d, as Caffe writes it
    proto.MergeFromString(packed_field(5, mean, np.float32))  # BlobProto.data, packed
    return proto


def main(argv: list[str]) -> int:
    parser = GflagsParser("compute_image_mean", USAGE)
    parser.add_flag("backend", str, "lmdb", "The backend {leveldb, lmdb} containing the images")
    ns = parser.parse(argv)
    if len(ns.args) not in (1, 2):
        raise usage_error(parser, f"expected 1 or 2 arguments, got {len(ns.args)}")
    mean = compute_mean(ns.args[0], ns.backend)
    if len(ns.args) == 2:
        log.info("Write to %s", ns.args[1])
        try:
            write_binary_atomically(ns.args[1], mean_to_proto(mean).SerializeToString())
        except OSError as exc:  # a WriteError names the file and the reason (a full disk, ...)
            raise CliError(f"OUTPUT_FILE: {exc}") from None
    log.info("Number of channels: %d", mean.shape[0])
    for c in range(mean.shape[0]):
        log.info("mean_value channel [%d]: %s", c, f"{mean[c].mean():g}")
    return 0
