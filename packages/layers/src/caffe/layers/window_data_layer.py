"""WindowData: batches of windows cropped from images, for R-CNN style fine-tuning
(Caffe's window_data_layer.cpp).

window_data_param.source is a window file, repeating:
    # image_index
    img_path            (root_folder + img_path)
    channels
    height
    width
    num_windows
    class_index overlap x1 y1 x2 y2      (num_windows lines, 0-based inclusive pixel boxes)
Windows with overlap >= fg_threshold are foreground (class > 0 required); those with
overlap < bg_threshold are background (label and overlap forced to 0); others are
dropped. Each batch samples batch_size * (1 - fg_fraction) background windows, then
the foreground ones, at random (with replacement). A window is optionally grown by
context_pad pixels of context (of the warped crop_size output) and, in crop_mode
"square", made square; the part inside the image is warped (bilinear) to its share
of crop_size x crop_size, mirrored at random when `mirror`, placed with the padding
left as zeros, minus the mean (mean_file, centered; or mean_value), times the scale
(window_data_param.scale when set, else transform_param.scale).
"""
from __future__ import annotations

import numpy as np

from caffe.blob import context
from caffe.layers.base_data import BasePrefetchingDataLayer
from caffe.layers.data_transformer import DataError, decode_image_bytes, load_mean_file
from caffe.layers.registry import register_layer

IMAGE_INDEX, LABEL, OVERLAP, X1, Y1, X2, Y2 = range(7)


def _round(x: float) -> int:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(np.floor(x + 0.5)) if x >= 0 else -int(np.floor(-x + 0.5))


def parse_window_file(source: str, root_folder: str = ""):
    """(images [(path, (channels, height, width))], windows [[image_index, label, overlap, x1, y1, x2, y2]])."""
    from caffe.blob.fileio import FileInputError, read_text_file
    try:
        text = read_text_file(source, "window file")  # a regular file only (no FIFO, no endless stream)
    except FileInputError as exc:
        raise DataError(f"failed to open window file '{source}': {exc.reason}") from None
    tokens = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        tokens.extend((tok, lineno) for tok in line.split())
    if not tokens:
        raise DataError(f"window file '{source}' is empty")
    pos = 0

    def take(what, conv):
        nonlocal pos
        if pos >= len(tokens):
            raise DataError(f"window file '{source}': ended early, expected {what}")
        tok, lineno = tokens[pos]
        pos += 1
        try:
            return conv(tok)
        except ValueError:
            raise DataError(f"window file '{source}' line {lineno}: expected {what}, got {tok!r}") from None

    images, windows = {}, []
    while pos < len(tokens):
        tok, lineno = tokens[pos]
        if tok != "#":
            raise DataError(f"window file '{source}' line {lineno}: expected '# image_index', got {tok!r}")
        pos += 1
        index = take("an image index after '#'", int)
        path = take("an image path", str)
        size = (take("channels", int), take("height", int), take("width", int))
        images[index] = (root_folder + path, size)
        for _ in range(take("the number of windows", int)):
            lineno = tokens[pos][1] if pos < len(tokens) else -1
            label = take("a window's class index", int)
            overlap = take("a window's overlap", np.float32)  # float, as Caffe reads it
            x1, y1, x2, y2 = (take("window coordinates x1 y1 x2 y2", int) for _ in range(4))
            windows.append(([index, label, overlap, x1, y1, x2, y2], lineno))
    return images, windows


@register_layer("WindowData")
class WindowDataLayer(BasePrefetchingDataLayer):
    exact_num_top_blobs = 2
    min_top_blobs = -1
    max_top_blobs = -1

    def data_layer_setup(self, bottom, top):
        wp = self.layer_param.window_data_param
        tp = self.transform_param
        self.crop_size = int(tp.crop_size or wp.crop_size)
        self.mirror = bool(tp.mirror or wp.mirror)
        self.scale = float(wp.scale if wp.HasField("scale") else tp.scale)
        self.batch_size = int(wp.batch_size)
        self.context_pad = int(wp.context_pad)
        self.fg_fraction = float(wp.fg_fraction)
        if wp.crop_mode not in ("warp", "square"):
            raise self.error(f"window_data_param.crop_mode must be 'warp' or 'square', got {wp.crop_mode!r}")
        self.use_square = wp.crop_mode == "square"
        if self.crop_size <= 0:
            raise self.error("transform_param.crop_size must be positive: it is the size of the warped windows")
        if self.batch_size <= 0:
            raise self.error(f"window_data_param.batch_size must be positive, got {self.batch_size}")
        if 2 * self.context_pad >= self.crop_size:
            raise self.error(f"context_pad {self.context_pad} leaves no room in crop_size {self.crop_size}")
        # Caffe seeds the prefetch generator from the runtime one when it draws.
        self._prefetch_rng = np.random.default_rng(int(context.rng().integers(0, 2**63 - 1)))
        try:
            self.images, windows = parse_window_file(wp.source, wp.root_folder)
        except DataError as exc:
            raise self.error(str(exc)) from None
        self.fg_windows, self.bg_windows = [], []
        fg_threshold, bg_threshold = np.float32(wp.fg_threshold), np.float32(wp.bg_threshold)
        for w, lineno in windows:
            if w[IMAGE_INDEX] not in self.images:
                raise self.error(f"window file '{wp.source}' line {lineno}: unknown image index {w[IMAGE_INDEX]}")
            if w[OVERLAP] >= fg_threshold:
                if w[LABEL] <= 0:
                    raise self.error(f"window file '{wp.source}' line {lineno}: a foreground window "
                                     f"(overlap {w[OVERLAP]} >= fg_threshold {wp.fg_threshold:g}) needs a class "
                                     f"index > 0, got {w[LABEL]}")
                self.fg_windows.append(w)
            elif w[OVERLAP] < bg_threshold:
                w = list(w)
                w[LABEL] = 0  # background: label and overlap forced to 0
                w[OVERLAP] = 0
                self.bg_windows.append(w)
        self.num_fg = int(np.float32(self.batch_size) * np.float32(self.fg_fraction))
        if self.num_fg and not self.fg_windows:
            raise self.error(f"window file '{wp.source}' has no foreground windows (overlap >= fg_threshold "
                             f"{wp.fg_threshold:g}) but fg_fraction asks for {self.num_fg} per batch")
        if self.batch_size - self.num_fg and not self.bg_windows:
            raise self.error(f"window file '{wp.source}' has no background windows (overlap < bg_threshold "
                             f"{wp.bg_threshold:g}) but fg_fraction leaves {self.batch_size - self.num_fg} "
                             f"per batch")
        channels = next(iter(self.images.values()))[1][0]
        if channels != 3:
            raise self.error(f"window file '{wp.source}': images are read in color (3 channels), "
                             f"the file says {channels}")
        self.mean = None
        self.mean_values = None
        if tp.HasField("mean_file") or wp.HasField("mean_file"):
            if len(tp.mean_value):
                raise self.error("cannot specify mean_file and mean_value at the same time")
            path = tp.mean_file if tp.HasField("mean_file") else wp.mean_file
            try:
                self.mean = load_mean_file(path)
            except DataError as exc:
                raise self.error(str(exc)) from None
            mc, mh, mw = self.mean.shape
            if mc != channels or mh < self.crop_size or mw < self.crop_size:
                raise self.error(f"mean_file '{path}' holds a {mc}x{mh}x{mw} mean; it needs {channels} "
                                 f"channels and at least crop_size {self.crop_size} in height and width")
        elif len(tp.mean_value):
            if len(tp.mean_value) not in (1, channels):
                raise self.error(f"specify either 1 mean_value or as many as channels: {channels}")
            mv = np.asarray(tp.mean_value, dtype=np.float32)
            self.mean_values = np.broadcast_to(mv, (channels,)).copy()
        self.cache_images = bool(wp.cache_images)
        self._cache = {}
        if self.cache_images:
            for idx, (path, _) in self.images.items():
                self._cache[idx] = self._read_file(path)
        top[0].reshape(self.batch_size, channels, self.crop_size, self.crop_size)
        top[1].reshape(self.batch_size)

    def _read_file(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise self.error(f"could not open or find image '{path}' (window file "
                             f"'{self.layer_param.window_data_param.source}'): {exc.strerror or exc}") from None

    def _rand(self) -> int:
        """Caffe's PrefetchRand: an unsigned 32-bit draw."""
        return int(self._prefetch_rng.integers(0, 2**32))

    def _load_image(self, index: int):
        from PIL import Image
        path = self.images[index][0]
        raw = self._cache[index] if self.cache_images else self._read_file(path)
        chw = decode_image_bytes(raw, force_color=True, where=f"image '{path}'")
        # back to an RGB Pillow image for cropping and warping
        return Image.fromarray(np.ascontiguousarray(chw[::-1].transpose(1, 2, 0)), "RGB")

    def _warp(self, img, window, do_mirror: bool):
        """The window's BGR pixels warped into place: (crop (C, h, w) uint8, pad_h, pad_w)."""
        from PIL import Image
        crop = self.crop_size
        x1, y1, x2, y2 = (int(window[k]) for k in (X1, Y1, X2, Y2))
        cols, rows = img.size
        out_w = out_h = crop
        pad_w = pad_h = 0
        if self.context_pad > 0 or self.use_square:
            f32 = np.float32
            context_scale = f32(crop) / f32(crop - 2 * self.context_pad)
            half_height = f32(y2 - y1 + 1) / f32(2.0)
            half_width = f32(x2 - x1 + 1) / f32(2.0)
            center_x = f32(x1) + half_width
            center_y = f32(y1) + half_height
            if self.use_square:
                half_width = half_height = max(half_height, half_width)
            x1 = _round(float(center_x - half_width * context_scale))
            x2 = _round(float(center_x + half_width * context_scale))
            y1 = _round(float(center_y - half_height * context_scale))
            y2 = _round(float(center_y + half_height * context_scale))
            unclipped_height, unclipped_width = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            clipped_height, clipped_width = y2 - y1 + 1, x2 - x1 + 1
            scale_x = f32(crop) / f32(unclipped_width)
            scale_y = f32(crop) / f32(unclipped_height)
            out_w = _round(float(f32(clipped_width) * scale_x))
            out_h = _round(float(f32(clipped_height) * scale_y))
            pad_x1 = _round(float(f32(pad_x1) * scale_x))
            pad_x2 = _round(float(f32(pad_x2) * scale_x))
            pad_y1 = _round(float(f32(pad_y1) * scale_y))
            pad_h = pad_y1
            pad_w = pad_x2 if do_mirror else pad_x1  # mirror the padding too
            out_h = min(out_h, crop - pad_h)
            out_w = min(out_w, crop - pad_w)
        if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows):
            raise DataError(f"window ({window[X1]}, {window[Y1]}, {window[X2]}, {window[Y2]}) lies outside "
                            f"its {cols}x{rows} image '{self.images[int(window[IMAGE_INDEX])][0]}'")
        if out_w <= 0 or out_h <= 0:
            return None, pad_h, pad_w
        region = img.crop((x1, y1, x2 + 1, y2 + 1)).resize((out_w, out_h), Image.BILINEAR)
        arr = np.asarray(region)[:, :, ::-1].transpose(2, 0, 1)  # BGR, CHW
        if do_mirror:
            arr = arr[:, :, ::-1]
        return arr, pad_h, pad_w

    def load_batch(self, batch):
        data = batch.data
        data[...] = 0
        crop = self.crop_size
        mean = None
        if self.mean is not None:
            mean = self.mean.astype(data.dtype, copy=False)
            mean_off = (mean.shape[2] - crop) // 2
        scale = data.dtype.type(self.scale)
        item = 0
        for is_fg, count in ((0, self.batch_size - self.num_fg), (1, self.num_fg)):
            pool = self.fg_windows if is_fg else self.bg_windows
            for _ in range(count):
                window = pool[self._rand() % len(pool)]
                do_mirror = self.mirror and bool(self._rand() % 2)
                img = self._load_image(int(window[IMAGE_INDEX]))
                try:
                    arr, pad_h, pad_w = self._warp(img, window, do_mirror)
                except DataError as exc:
                    raise self.error(str(exc)) from None
                if arr is not None:
                    _, h, w = arr.shape
                    dst = data[item, :, pad_h:pad_h + h, pad_w:pad_w + w]
                    np.copyto(dst, arr, casting="unsafe")
                    if mean is not None:
                        dst -= mean[:, mean_off + pad_h:mean_off + pad_h + h, mean_off + pad_w:mean_off + pad_w + w]
                    elif self.mean_values is not None:
                        dst -= self.mean_values.astype(data.dtype)[:, None, None]
                    dst *= scale
                batch.label[item] = window[LABEL]
                item += 1
