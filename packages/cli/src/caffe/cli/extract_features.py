"""extract_features: forward a net and save blobs as float Datums (Caffe's tools/extract_features.cpp).

    caffe-cli extract_features pretrained_net_param feature_extraction_proto_file \\
        extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] \\
        num_mini_batches db_type [CPU/GPU] [DEVICE_ID=0]

The net is built in the TEST phase from the prototxt (its data layer feeds it),
weights come from the caffemodel. For each mini-batch and each named blob, item n of
the batch becomes a Datum {channels, height, width of the blob, float_data = its
values} under key '%010d' of the running item count, in the matching database.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.cli.main import CliError

log = logging.getLogger("caffe")

USAGE = """This program takes in a trained network and an input data layer, and then
extract features of the input data produced by the net.
Usage: extract_features  pretrained_net_param  feature_extraction_proto_file  extract_feature_blob_name1[,name2,...]  save_feature_dataset_name1[,name2,...]  num_mini_batches  db_type  [CPU/GPU] [DEVICE_ID=0]
Note: you can extract multiple features in one pass by specifying multiple feature blob names and dataset names separated by ','. The names cannot contain white space characters and the number of blobs and datasets must be equal."""


def _net_class():
    try:
        from caffe.net import Net
    except ImportError as exc:
        raise CliError(f"extract_features needs the caffe-net package (pip install caffe-net): {exc}") from None
    return Net


def extract(weights: str, proto: str, blob_names: list[str], db_names: list[str], num_mini_batches: int,
            backend: str = "lmdb") -> int:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    Net = _net_class()
    if len(blob_names) != len(db_names):
        raise CliError(f"the number of blob names ({len(blob_names)}) and dataset names ({len(db_names)}) "
                       f"must be equal")
    net = Net(proto, phase=1)  # caffe.TEST
    net.CopyTrainedLayersFrom(weights)
    for name in blob_names:
        if name not in net.blobs:
            raise CliError(f"Unknown feature blob name {name} in the network {proto} "
                           f"(blobs: {', '.join(net.blobs)})")
    writers = []
    try:
        for name in db_names:
            log.info("Opening dataset %s", name)
            writers.append(DBWriter(name, backend, batch=1000))
        log.info("Extracting Features")
        counts = [0] * len(blob_names)
        datum = caffe_pb2.Datum()
        for _ in range(num_mini_batches):
            net.Forward()
            for i, name in enumerate(blob_names):
                blob = net.blobs[name]
                feats = np.asarray(blob.cpu_data(), dtype=np.float32).reshape(blob.num, -1)
                datum.channels, datum.height, datum.width = blob.channels, blob.height, blob.width
                for row in feats:
                    del datum.float_data[:]
                    datum.float_data.extend(row.tolist())
                    writers[i].put(b"%010d" % counts[i], datum.SerializeToString())
                    counts[i] += 1
                    if counts[i] % 1000 == 0:
                        log.info("Extracted features of %d query images for feature blob %s", counts[i], name)
        for i, w in enumerate(writers):
            if counts[i] % 1000:
                log.info("Extracted features of %d query images for feature blob %s", counts[i], blob_names[i])
            w.close()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    log.info("Successfully extracted the features!")
    return sum(counts)


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if len(argv) < 6:
        raise CliError(f"expected at least 6 arguments, got {len(argv)}\n\n{USAGE}")
    weights, proto, blobs, dbs, num, backend = argv[:6]
    try:
        num_mini_batches = int(num)
    except ValueError:
        raise CliError(f"num_mini_batches must be an integer, got {num!r}") from None
    from caffe.blob import context
    if len(argv) > 6 and argv[6].upper() == "GPU":
        device = int(argv[7]) if len(argv) > 7 else 0
        log.info("Using Device_id=%d", device)
        context.set_device(device)
        context.set_mode_gpu()
    else:
        log.info("Using CPU")
        context.set_mode_cpu()
    extract(weights, proto, blobs.split(","), dbs.split(","), num_mini_batches, backend)
    return 0
