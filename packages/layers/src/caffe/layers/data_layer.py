"""Data: batches of Datums from an LMDB or LevelDB database (Caffe's data_layer.cpp).

Records are read in cursor order (= key order) and wrap around at the end. Each
batch is shaped by its first record (Caffe's per-batch InferBlobShape); every other
record of the batch must have the same size (or, with crop_size, at least the crop).
Datums may be raw (uint8 data or float_data) or encoded (JPEG/PNG/..., decoded in
parallel with Pillow). Labels go to top[1] when there are two tops.

Data-parallel sharding (Caffe's Skip()): with solver_count() = N and solver_rank() = r,
rank r keeps the records at stream positions r, r+N, r+2N, ... (the stream runs on
across wrap-arounds), so N ranks of batch b together see what one rank of batch N*b
sees. As in Caffe, the TEST phase does not shard (only one rank tests).

The database is opened read-only (lock=False) in the prefetch thread that reads it;
setup peeks at the first record with a short-lived handle to shape the tops.
"""
from __future__ import annotations

import numpy as np

from caffe.blob import context
from caffe.layers import db as dbmod
from caffe.layers.base_data import BasePrefetchingDataLayer, parallel_map
from caffe.layers.data_transformer import DataError, parse_datum
from caffe.layers.registry import register_layer
from caffe.proto import caffe_pb2

_Datum = caffe_pb2.Datum


def _key_text(key: bytes) -> str:
    try:
        return key.decode("ascii")
    except UnicodeDecodeError:
        return key.hex()


@register_layer("Data")
class DataLayer(BasePrefetchingDataLayer):

    def data_layer_setup(self, bottom, top):
        p = self.layer_param.data_param
        if not self.layer_param.HasField("data_param") or not p.source:
            raise self.error("data_param.source must name the database to read")
        self.batch_size = int(p.batch_size)
        if self.batch_size <= 0:
            raise self.error(f"data_param.batch_size must be positive, got {self.batch_size}")
        if p.force_encoded_color and not self.data_transformer.force_gray:
            self.data_transformer.force_color = True  # the deprecated DataParameter spelling
        try:
            self.backend = dbmod.backend_name(p.backend)
            with dbmod.open_db(p.source, self.backend) as d:
                cur = d.new_cursor()
                key, value = cur.key(), cur.value()
        except dbmod.DBError as exc:
            raise self.error(f"{exc} (data_param.source)") from None
        try:
            datum = parse_datum(value, self._where(key))
            shape = self.data_transformer.infer_blob_shape(datum, self._where(key))
        except DataError as exc:
            raise self.error(str(exc).replace(f"{self.data_transformer.name}: ", "")) from None
        shape[0] = self.batch_size
        top[0].reshape(shape)
        if self.output_labels:
            top[1].reshape([self.batch_size])
        self._db = None
        self._cursor = None
        self._offset = 0

    def _where(self, key: bytes) -> str:
        kind = "LMDB" if self.backend == dbmod.LMDB else "LevelDB"
        return f"record '{_key_text(key)}' of {kind} '{self.layer_param.data_param.source}'"

    # -- on the prefetch thread ------------------------------------------------------
    def thread_begin(self):
        p = self.layer_param.data_param
        try:
            self._db = dbmod.open_db(p.source, self.backend)
            self._cursor = self._db.new_cursor()
        except dbmod.DBError as exc:
            raise self.error(f"{exc} (data_param.source)") from None
        self._offset = 0

    def thread_end(self):
        if self._db is not None:
            self._db.close()
            self._db = None

    def _next(self) -> None:
        cur = self._cursor
        cur.next()
        if not cur.valid():
            cur.seek_to_first()  # "Restarting data prefetching from start."
        self._offset += 1

    def _read_records(self, n: int) -> list[tuple[bytes, bytes]]:
        try:
            return self._read_records_unchecked(n)
        except dbmod.DBError as exc:  # a corrupt page: say which layer was reading it
            raise self.error(f"{exc} (data_param.source)") from None

    def _read_records_unchecked(self, n: int) -> list[tuple[bytes, bytes]]:
        out = []
        cur = self._cursor
        # Caffe's Skip(): keep stream position `offset` when offset % solver_count == solver_rank
        # (the TEST phase keeps everything). The coordinates came with the thread's context.
        count, rank = (1, 0) if self.phase == 1 else (context.solver_count(), context.solver_rank())
        for _ in range(n):
            while self._offset % count != rank:
                self._next()
            out.append((cur.key(), cur.value()))
            self._next()
        return out

    def _parse_all(self, records) -> list:
        try:
            return [_Datum.FromString(v) for _, v in records]
        except Exception:  # find the corrupt one and name it
            return [parse_datum(v, self._where(k)) for k, v in records]

    def load_batch(self, batch):
        records = self._read_records(self.batch_size)
        datums = self._parse_all(records)
        tf = self.data_transformer
        first = datums[0]
        where = lambda i: self._where(records[i][0])  # noqa: E731  (built only for an error message)
        map_fn = None
        c, h, w = first.channels, first.height, first.width
        size = c * h * w
        if not first.encoded and size and all(
                not d.encoded and d.channels == c and d.height == h and d.width == w and len(d.data) == size
                for d in datums):
            # raw uint8 records of one size: one contiguous (N, C, H, W) array, transformed as a whole
            images = np.frombuffer(b"".join(d.data for d in datums), dtype=np.uint8).reshape(
                len(datums), c, h, w)
        elif first.encoded:
            images = parallel_map(lambda i: tf.image(datums[i], where(i)), list(range(len(datums))))
            map_fn = parallel_map  # big decoded images: transform each on the pool too
        else:
            images = [tf.image(d, where(i)) for i, d in enumerate(datums)]
        shape = tf.infer_blob_shape(images[0], where(0))
        shape[0] = self.batch_size
        data = batch.reshape_data(shape)
        tf.transform_batch(images, data, where=where, map_fn=map_fn)
        if self.output_labels:
            batch.label[...] = [d.label for d in datums]
