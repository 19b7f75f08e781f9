"""DataTransformer: Caffe's data_transformer.cpp, vectorized over a whole batch.

Per item, in Caffe's order: crop (random offsets in TRAIN, centered in TEST), mirror
(a coin flip per item when `mirror`), subtract the mean (mean_file at the same source
pixels, or one mean_value per channel, or one for all), then scale:
    top = (x[c, h_off + h, w_off + w] - mean) * scale      (w reversed when mirrored)
computed in the top's dtype exactly as Caffe does (float32 (x - mean) * scale), so a
float32 batch matches Caffe bit for bit.

Images are channels-first arrays (C, H, W), uint8 (Datum.data, decoded images) or
float32 (Datum.float_data). Color images are kept in BGR order, as Caffe (OpenCV)
stores and decodes them, so mean values such as (104, 117, 123) mean what they mean
in Caffe's model zoo. Encoded Datums (JPEG/PNG/...) are decoded with Pillow, which
releases the GIL, so a pool of threads decodes in parallel.

Random draws come from the transformer's own generator, seeded by `init_rand()` from
the runtime generator at layer setup (Caffe's InitRand), so results are reproducible
under caffe.set_random_seed whichever thread runs the transform.
"""
from __future__ import annotations

import io
import os

import numpy as np

from caffe.blob import context


class DataError(ValueError):
    """Bad data: a record, image, mean file or list entry that cannot be used; the message names it."""


# ----------------------------------------------------------------------------- Datum helpers

def parse_datum(value: bytes, where: str = "record"):
    """A Datum from its serialized bytes; a corrupt record raises DataError naming `where`."""
    from caffe.proto import caffe_pb2
    from google.protobuf.message import DecodeError
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise DataError(f"{where} is not a valid serialized Datum ({len(value)} bytes): {exc}") from None
    return datum


def _decode_mode(img, force_color: bool, force_gray: bool):
    """Pillow image -> 'L' or 'RGB' the way OpenCV's imdecode(ANYCOLOR/COLOR/GRAYSCALE) would."""
    if force_color:
        return img.convert("RGB") if img.mode != "RGB" else img
    if force_gray:
        return img.convert("L") if img.mode != "L" else img
    if img.mode in ("L", "RGB"):
        return img
    if img.mode in ("1", "LA", "I", "I;16", "I;16B", "I;16L", "F"):
        if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            # 16/32-bit gray: OpenCV without ANYDEPTH gives 8 bits (value >> 8 for 16-bit).
            arr = np.asarray(img, dtype=np.float64)
            arr = arr / 256.0 if img.mode.startswith("I;16") or arr.max(initial=0) > 255 else arr
            from PIL import Image
            return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "L")
        return img.convert("L")
    if img.mode == "P":
        return img.convert("RGB") if img.info.get("transparency") is None else img.convert("RGBA").convert("RGB")
    return img.convert("RGB")  # RGBA (alpha dropped as ANYCOLOR does), CMYK, YCbCr, ...


def pil_to_chw(img) -> np.ndarray:
    """A Pillow 'L' or 'RGB' image as a (C, H, W) uint8 view: gray (1, H, W) or BGR (3, H, W)."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        return arr[None]
    return arr[:, :, ::-1].transpose(2, 0, 1)


def decode_image_bytes(data: bytes, force_color: bool = False, force_gray: bool = False,
                       where: str = "image") -> np.ndarray:
    """Decode an encoded image (any format Pillow reads) to a (C, H, W) uint8 array (BGR for color)."""
    from PIL import Image, UnidentifiedImageError
    if force_color and force_gray:
        raise DataError(f"{where}: cannot set both force_color and force_gray")
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > _MAX_PIXELS_PER_BYTE * len(data) + (1 << 20):  # checked before the pixels are allocated
            raise _CorruptHeader(f"it declares {w}x{h} pixels, more than so few bytes can encode: its header "
                                 f"is corrupt")
        img.load()  # decodes (Pillow releases the GIL here)
        img = _decode_mode(img, force_color, force_gray)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"{where}: cannot decode the encoded image ({len(data)} bytes): {exc}") from None
    return pil_to_chw(img)


class _CorruptHeader(ValueError):
    pass


# The densest encodings: deflate expands a byte to at most 1032, at 1 bit per pixel (a 1-bit PNG): ~8256
# pixels per byte. A header claiming more is corrupt; refusing it spares a huge allocation.
_MAX_PIXELS_PER_BYTE = 8256


def read_image(path: str, height: int = 0, width: int = 0, is_color: bool = True,
               where: str | None = None) -> np.ndarray:
    """Caffe's ReadImageToCVMat: read a file as (C, H, W) uint8, color (BGR) or gray, resized
    (bilinear) to height x width when both are > 0."""
    from PIL import Image, UnidentifiedImageError
    where = where or f"image '{path}'"
    from caffe.blob.fileio import FileInputError, open_regular_file
    try:
        f, _ = open_regular_file(path, "image")  # a FIFO or device is refused, never read
    except FileInputError as exc:
        if not os.path.exists(path):
            raise DataError(f"{where}: no such file '{path}'") from None
        raise DataError(f"{where}: {exc}") from None
    try:
        with f:
            img = Image.open(f)
            img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"{where}: cannot decode image '{path}': {exc}") from None
    img = _decode_mode(img, is_color, not is_color)
    if height > 0 and width > 0 and img.size != (width, height):
        img = img.resize((width, height), Image.BILINEAR)
    return pil_to_chw(img)


def datum_shape(datum) -> tuple[int, int, int]:
    return int(datum.channels), int(datum.height), int(datum.width)


def datum_to_image(datum, force_color: bool = False, force_gray: bool = False,
                   where: str = "Datum") -> np.ndarray:
    """The (C, H, W) array a Datum holds: decoded when encoded, uint8 data, or float_data."""
    if datum.encoded:
        return decode_image_bytes(datum.data, force_color, force_gray, where)
    c, h, w = datum_shape(datum)
    if c <= 0 or h <= 0 or w <= 0:
        raise DataError(f"{where}: Datum has a non-positive shape {c}x{h}x{w}")
    n = c * h * w
    if len(datum.data):
        if len(datum.data) != n:
            raise DataError(f"{where}: Datum holds {len(datum.data)} bytes of data but its shape "
                            f"{c}x{h}x{w} needs {n}")
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
    if len(datum.float_data) != n:
        raise DataError(f"{where}: Datum holds {len(datum.float_data)} float_data values but its shape "
                        f"{c}x{h}x{w} needs {n}")
    return np.asarray(datum.float_data, dtype=np.float32).reshape(c, h, w)


def array_to_datum(arr, label: int | None = None):
    """A raw Datum from a (C, H, W) array: uint8 -> data bytes, anything else -> float_data."""
    from caffe.proto import caffe_pb2
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise DataError(f"array_to_datum: expected a (C, H, W) array, got shape {arr.shape}")
    d = caffe_pb2.Datum()
    d.channels, d.height, d.width = (int(s) for s in arr.shape)
    if arr.dtype == np.uint8:
        d.data = np.ascontiguousarray(arr).tobytes()
    else:
        d.float_data.extend(np.asarray(arr, dtype=np.float32).ravel().tolist())
    if label is not None:
        d.label = int(label)
    return d


def load_mean_file(path: str) -> np.ndarray:
    """A mean BlobProto (binaryproto, as compute_image_mean writes) as a (C, H, W) float32 array."""
    from caffe.proto import caffe_pb2
    from google.protobuf.message import DecodeError
    from caffe.blob.proto_io import blob_proto_to_array
    from caffe.blob.fileio import FileInputError, read_regular_file
    try:
        raw = read_regular_file(path, "mean_file", fmt="a BlobProto")  # a regular file, at most 2 GiB
    except FileInputError as exc:
        raise DataError(f"cannot read mean_file '{path}': {exc.reason}") from None
    proto = caffe_pb2.BlobProto()
    try:
        proto.ParseFromString(raw)
        arr = blob_proto_to_array(proto)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DataError(f"mean_file '{path}' is not a valid BlobProto: {exc}") from None
    arr = np.asarray(arr, dtype=np.float32)
    # Caffe reads the mean as a Blob and uses channels/height/width: drop leading 1s (num).
    while arr.ndim > 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise DataError(f"mean_file '{path}' holds a blob of shape {arr.shape}; expected (1,) C x H x W")
    return np.ascontiguousarray(arr)


# ----------------------------------------------------------------------------- the transformer

class DataTransformer:
    """Caffe's DataTransformer for one layer (`param` is a TransformationParameter).

    `name` prefixes error messages (e.g. "Layer 'mnist' (Data)").
    """

    def __init__(self, param=None, phase: int = 0, name: str = "DataTransformer"):
        from caffe.proto import caffe_pb2
        p = caffe_pb2.TransformationParameter()
        if param is not None:
            p.CopyFrom(param)
        self.param = p
        self.phase = phase
        self.name = name
        self.scale = float(p.scale)
        self.crop_size = int(p.crop_size)
        self.mirror = bool(p.mirror)
        self.force_color = bool(p.force_color)
        self.force_gray = bool(p.force_gray)
        if self.force_color and self.force_gray:
            raise DataError(f"{name}: transform_param cannot set both force_color and force_gray")
        self.mean = None
        self.mean_values = None
        if p.HasField("mean_file"):
            if len(p.mean_value):
                raise DataError(f"{name}: cannot specify transform_param mean_file and mean_value "
                                f"at the same time")
            try:
                self.mean = load_mean_file(p.mean_file)
            except DataError as exc:
                raise DataError(f"{name}: {exc}") from None
        elif len(p.mean_value):
            self.mean_values = np.asarray(p.mean_value, dtype=np.float32)
        self._rng = None

    # -- randomness ---------------------------------------------------------------
    def needs_rand(self) -> bool:
        return self.mirror or (self.phase == 0 and self.crop_size > 0)

    def init_rand(self) -> None:
        """Seed our generator from the runtime one (only when we draw, as Caffe's InitRand)."""
        if self.needs_rand():
            self._rng = np.random.default_rng(int(context.rng().integers(0, 2**63 - 1)))
        else:
            self._rng = None

    InitRand = init_rand

    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self.init_rand()
            if self._rng is None:
                self._rng = np.random.default_rng(int(context.rng().integers(0, 2**63 - 1)))
        return self._rng

    # -- shapes and checks ------------------------------------------------------------
    def image(self, datum, where: str = "Datum") -> np.ndarray:
        """The (C, H, W) array of a Datum (decoded when encoded, honoring force_color/force_gray)."""
        return datum_to_image(datum, self.force_color, self.force_gray, where)

    def infer_blob_shape(self, item, where: str = "Datum") -> list[int]:
        """[1, C, h, w] a Datum or (C, H, W) image transforms to (Caffe's InferBlobShape)."""
        img = item if isinstance(item, np.ndarray) else self.image(item, where)
        self.check_image(img, where)
        c, h, w = img.shape
        if self.crop_size:
            h = w = self.crop_size
        return [1, c, h, w]

    InferBlobShape = infer_blob_shape

    def check_image(self, img: np.ndarray, where: str) -> None:
        c, h, w = img.shape
        if c <= 0:
            raise DataError(f"{self.name}: {where} has no channels")
        if self.crop_size and (h < self.crop_size or w < self.crop_size):
            raise DataError(f"{self.name}: {where} is {h}x{w}, smaller than crop_size {self.crop_size}")
        if self.mean is not None and self.mean.shape != img.shape:
            mc, mh, mw = self.mean.shape
            raise DataError(f"{self.name}: mean_file '{self.param.mean_file}' holds a {mc}x{mh}x{mw} mean "
                            f"but {where} is {c}x{h}x{w}; they must agree (channels x height x width)")
        if self.mean_values is not None and len(self.mean_values) not in (1, c):
            raise DataError(f"{self.name}: specify either 1 mean_value or as many as channels ({c}); "
                            f"got {len(self.mean_values)} for {where}")

    # -- transforms -----------------------------------------------------------------
    def _draw(self, shapes: list[tuple[int, int, int]]):
        """Per item: mirror flag, h_off, w_off (Caffe: Rand(2) when mirror, then the crop offsets)."""
        n = len(shapes)
        crop = self.crop_size
        mirror = np.zeros(n, dtype=bool)
        hs = np.array([s[1] for s in shapes], dtype=np.int64)
        ws = np.array([s[2] for s in shapes], dtype=np.int64)
        if self.mirror:
            mirror = self.rng().integers(0, 2, size=n).astype(bool)
        if crop:
            if self.phase == 0:  # TRAIN: random crop
                h_off = self.rng().integers(0, hs - crop + 1)
                w_off = self.rng().integers(0, ws - crop + 1)
            else:
                h_off = (hs - crop) // 2
                w_off = (ws - crop) // 2
        else:
            h_off = np.zeros(n, dtype=np.int64)
            w_off = np.zeros(n, dtype=np.int64)
        return mirror, h_off, w_off

    def _window(self, img, mirror, h0, w0):
        """The cropped (and mirrored) view of one image."""
        if self.crop_size:
            c = self.crop_size
            img = img[:, h0:h0 + c, w0:w0 + c]
        return img[:, :, ::-1] if mirror else img

    def transform_batch(self, images, out: np.ndarray, where=None, map_fn=None) -> None:
        """Transform N images into `out` (N, C, h, w) in place.

        `images` is a list of (C, H, W) arrays or one (N, C, H, W) array. `where(i)` names
        item i in error messages. Without `map_fn` the mean and scale run over the whole
        batch at once; with `map_fn(fn, items)` (e.g. a thread pool's map) each item is
        transformed whole by `fn(i)`, in parallel: big images, where copying dominates.
        """
        n = len(images)
        if n == 0:
            raise DataError(f"{self.name}: there is no datum to transform")
        if n > out.shape[0]:
            raise DataError(f"{self.name}: {n} items do not fit a batch of {out.shape[0]}")
        name = where or (lambda i: f"item {i}")
        shapes = [tuple(img.shape) for img in images]
        c_out, h_out, w_out = out.shape[1:]
        for i, s in enumerate(shapes):
            if len(s) != 3:
                raise DataError(f"{self.name}: {name(i)} has shape {s}; expected channels x height x width")
            if i == 0 or s != shapes[0]:
                self.check_image(images[i], name(i))
            if s[0] != c_out or (not self.crop_size and s[1:] != (h_out, w_out)):
                first = "x".join(map(str, (c_out, h_out, w_out)))
                raise DataError(f"{self.name}: {name(i)} is {'x'.join(map(str, s))} but the batch holds "
                                f"{first} items (shaped by its first record); every record must have "
                                f"the same size")
        mirror, h_off, w_off = self._draw(shapes)
        dst = out[:n]
        dtype = out.dtype
        mean = self.mean.astype(dtype, copy=False) if self.mean is not None else None
        mv = None
        if self.mean_values is not None:
            mv = self.mean_values.astype(dtype)
            mv = mv[0] if len(mv) == 1 else mv[:, None, None]
        scale = dtype.type(self.scale) if self.scale != 1.0 else None

        if map_fn is not None:
            # per item, all steps, on a thread pool (NumPy releases the GIL for these loops)
            def one(i):
                d = dst[i]
                np.copyto(d, self._window(images[i], mirror[i], h_off[i], w_off[i]), casting="unsafe")
                if mean is not None:
                    d -= self._window(mean, mirror[i], h_off[i], w_off[i])
                elif mv is not None:
                    d -= mv
                if scale is not None:
                    d *= scale
            map_fn(one, list(range(n)))
            return

        plain = not self.crop_size and not mirror.any()
        if isinstance(images, np.ndarray) and plain:
            np.copyto(dst, images, casting="unsafe")  # the whole batch in one cast
        else:
            for i, img in enumerate(images):
                np.copyto(dst[i], self._window(img, mirror[i], h_off[i], w_off[i]), casting="unsafe")
        if mean is not None:
            if plain:
                dst -= mean
            else:
                for i in range(n):
                    dst[i] -= self._window(mean, mirror[i], h_off[i], w_off[i])
        elif mv is not None:
            dst -= mv
        if scale is not None:
            dst *= scale

    def transform(self, item, out: np.ndarray | None = None, dtype=np.float32,
                  where: str = "Datum") -> np.ndarray:
        """Transform one Datum or (C, H, W) image; returns the (C, h, w) result (or fills `out`)."""
        img = item if isinstance(item, np.ndarray) else self.image(item, where)
        if img.ndim != 3:
            raise DataError(f"{self.name}: {where} has shape {img.shape}; expected channels x height x width")
        shape = self.infer_blob_shape(img, where)
        if out is None:
            out = np.empty(shape[1:], dtype=dtype)
        self.transform_batch([img], out[None], where=lambda i: where)
        return out

    Transform = transform


def decode_threads() -> int:
    """Threads for decoding encoded images: one per core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))
