"""ImageData: batches of image files named in a list file (Caffe's image_data_layer.cpp).

The list file (image_data_param.source) holds one "path label" line per image; the
path may contain spaces (the label is what follows the last space). Paths are
relative to root_folder (plain concatenation, as Caffe). Images are read in color
(BGR) or gray (is_color), resized (bilinear) to new_height x new_width when both are
set, decoded in parallel with Pillow, and transformed like Data. With shuffle, the
list is shuffled at setup and at every epoch with the layer's own generator (seeded
from the runtime one); rand_skip skips a random number of lines at the start.
"""
from __future__ import annotations

import logging

import numpy as np

from caffe.blob import context
from caffe.layers.base_data import BasePrefetchingDataLayer, parallel_map
from caffe.layers.data_transformer import DataError, read_image
from caffe.layers.registry import register_layer

log = logging.getLogger("caffe")


def read_list_file(source: str, what: str = "list file") -> list[tuple[str, int, int]]:
    """[(path, label, line_number)] from a "path label" list; bad lines raise DataError naming them."""
    from caffe.blob.fileio import FileInputError, read_text_file
    try:
        text = read_text_file(source, what)  # a regular file only: a FIFO or /dev/zero cannot hang the read
    except FileInputError as exc:
        raise DataError(f"cannot open {what} '{source}': {exc.reason}") from None
    entries = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.rstrip().rsplit(None, 1)  # the label follows the last blank: paths may hold spaces
        try:
            if len(parts) != 2:
                raise ValueError
            label = int(parts[1])
        except ValueError:
            raise DataError(f"{what} '{source}' line {lineno}: expected 'path label' (an integer label "
                            f"after the last space), got {line!r}") from None
        entries.append((parts[0], label, lineno))
    return entries


@register_layer("ImageData")
class ImageDataLayer(BasePrefetchingDataLayer):

    def data_layer_setup(self, bottom, top):
        p = self.layer_param.image_data_param
        self.new_height = int(p.new_height)
        self.new_width = int(p.new_width)
        self.is_color = bool(p.is_color)
        self.root_folder = p.root_folder
        self.batch_size = int(p.batch_size)
        if not ((self.new_height == 0 and self.new_width == 0) or (self.new_height > 0 and self.new_width > 0)):
            raise self.error("image_data_param.new_height and new_width must be set at the same time")
        if self.batch_size <= 0:
            raise self.error(f"image_data_param.batch_size must be positive, got {self.batch_size}")
        if not p.source:
            raise self.error("image_data_param.source must name the list file")
        try:
            self.lines = read_list_file(p.source)
        except DataError as exc:
            raise self.error(str(exc)) from None
        if not self.lines:
            raise self.error(f"list file '{p.source}' is empty: no 'path label' lines")
        self._prefetch_rng = None
        if p.shuffle:
            # Caffe: prefetch_rng_ seeded from caffe_rng_rand(), then ShuffleImages().
            self._prefetch_rng = np.random.default_rng(int(context.rng().integers(0, 2**63 - 1)))
            self._shuffle_images()
        elif self.phase == 0 and context.solver_rank() > 0 and p.rand_skip == 0:
            log.warning("Layer '%s' (ImageData): shuffling or skipping recommended for multi-GPU", self.name)
        self.lines_id = 0
        if p.rand_skip:
            self.lines_id = int(context.rng().integers(0, 2**32)) % int(p.rand_skip)
            if self.lines_id >= len(self.lines):
                raise self.error(f"rand_skip drew {self.lines_id} but the list has only {len(self.lines)} lines")
        img = self._read(self.lines[self.lines_id])
        try:
            shape = self.data_transformer.infer_blob_shape(img, self._where(self.lines[self.lines_id]))
        except DataError as exc:
            raise self.error(str(exc).replace(f"{self.data_transformer.name}: ", "")) from None
        shape[0] = self.batch_size
        top[0].reshape(shape)
        if self.output_labels:
            top[1].reshape([self.batch_size])

    def _where(self, entry) -> str:
        path, _, lineno = entry
        return f"image '{self.root_folder + path}' (list file '{self.layer_param.image_data_param.source}' " \
               f"line {lineno})"

    def _read(self, entry) -> np.ndarray:
        try:
            return read_image(self.root_folder + entry[0], self.new_height, self.new_width, self.is_color,
                              where=self._where(entry))
        except DataError as exc:
            raise self.error(str(exc)) from None

    def _shuffle_images(self) -> None:
        order = self._prefetch_rng.permutation(len(self.lines))
        self.lines = [self.lines[i] for i in order]

    def load_batch(self, batch):
        entries = []
        for _ in range(self.batch_size):
            entries.append(self.lines[self.lines_id])
            self.lines_id += 1
            if self.lines_id >= len(self.lines):
                self.lines_id = 0  # "Restarting data prefetching from start."
                if self._prefetch_rng is not None:
                    self._shuffle_images()
        images = parallel_map(self._read, entries)
        tf = self.data_transformer
        shape = tf.infer_blob_shape(images[0], self._where(entries[0]))
        shape[0] = self.batch_size
        data = batch.reshape_data(shape)
        tf.transform_batch(images, data, where=lambda i: self._where(entries[i]), map_fn=parallel_map)
        if self.output_labels:
            batch.label[...] = [e[1] for e in entries]
