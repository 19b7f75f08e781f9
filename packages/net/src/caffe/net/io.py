"""pycaffe's caffe.io: BlobProto/Datum <-> arrays, the input Transformer, image loading and resizing.

Images are H x W x K float arrays in [0, 1] (load_image), as in pycaffe; nets take
K x H x W, which the Transformer produces (transpose, channel swap, raw scale,
mean, input scale, in that order). Loading images needs Pillow (`pip install
pillow`); resizing is bilinear (or nearest) NumPy code, edges clamped.
"""
from __future__ import annotations

import numpy as np

from caffe.blob.proto_io import array_to_blob_proto, blob_proto_to_array
from caffe.proto import caffe_pb2

# -- BlobProto and Datum --------------------------------------------------------------------------------


def blobproto_to_array(blob, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or diff) as an array of its shape (legacy 4-d num/channels/height/width too)."""
    return blob_proto_to_array(blob, return_diff=return_diff)


def array_to_blobproto(arr, diff=None):
    """An N-d array (and optional diff of the same shape) as a float BlobProto."""
    arr = np.asarray(arr)
    if diff is not None and np.shape(diff) != arr.shape:
        raise ValueError(f"array_to_blobproto: diff shape {np.shape(diff)} differs from data shape {arr.shape}")
    return array_to_blob_proto(arr, diff=diff)


def arraylist_to_blobprotovector_str(arraylist) -> bytes:
    """Serialize a list of arrays as a BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    for arr in arraylist:
        vec.blobs.add().CopyFrom(array_to_blobproto(arr))
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(str_) -> list:
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(str_)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None):
    """A C x H x W array as a Datum: uint8 arrays go to `data` (bytes), others to `float_data`."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"Incorrect array shape: a Datum holds a 3-d C x H x W array, got shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum) -> np.ndarray:
    """A Datum's content as a C x H x W array (uint8 from `data`, float from `float_data`)."""
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    return np.array(datum.float_data).astype(float).reshape(shape)


# -- preprocessing ------------------------------------------------------------------------------------------

class Transformer:
    """Preprocess images (H x W x K) into net inputs (K x H x W) and back, per input blob name."""

    def __init__(self, inputs: dict):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in inputs.items()}
        self.transpose, self.channel_swap = {}, {}
        self.raw_scale, self.mean, self.input_scale = {}, {}, {}

    def __check_input(self, in_):
        if in_ not in self.inputs:
            raise KeyError(f"{in_} is not one of the net inputs: {sorted(self.inputs)}")

    def preprocess(self, in_, data) -> np.ndarray:
        """resize to the input's H x W, transpose, swap channels, * raw_scale, - mean, * input_scale."""
        self.__check_input(in_)
        caffe_in = np.asarray(data).astype(np.float32, copy=False)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        transpose = self.transpose.get(in_)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        channel_swap = self.channel_swap.get(in_)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        caffe_in = np.array(caffe_in, dtype=np.float32)  # own copy: the steps below work in place
        if self.raw_scale.get(in_) is not None:
            caffe_in *= self.raw_scale[in_]
        if self.mean.get(in_) is not None:
            caffe_in -= self.mean[in_]
        if self.input_scale.get(in_) is not None:
            caffe_in *= self.input_scale[in_]
        return caffe_in

    def deprocess(self, in_, data) -> np.ndarray:
        """Invert preprocess (except resizing)."""
        self.__check_input(in_)
        decaf_in = np.array(data, dtype=np.float32).squeeze()
        if self.input_scale.get(in_) is not None:
            decaf_in /= self.input_scale[in_]
        if self.mean.get(in_) is not None:
            decaf_in += self.mean[in_]
        if self.raw_scale.get(in_) is not None:
            decaf_in /= self.raw_scale[in_]
        if self.channel_swap.get(in_) is not None:
            decaf_in = decaf_in[np.argsort(self.channel_swap[in_]), :, :]
        if self.transpose.get(in_) is not None:
            decaf_in = decaf_in.transpose(np.argsort(self.transpose[in_]))
        return decaf_in

    def set_transpose(self, in_, order) -> None:
        """Order of the image's axes for the net, e.g. (2, 0, 1) for H x W x K -> K x H x W."""
        self.__check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise ValueError("Transpose order needs to have the same number of dimensions as the input.")
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_, order) -> None:
        """Reorder channels, e.g. (2, 1, 0) for RGB -> BGR."""
        self.__check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise ValueError("Channel swap needs to have the same number of dimensions as the input channels.")
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_, scale) -> None:
        """Scale applied after transposing, e.g. 255 for [0, 1] images into a [0, 255] model."""
        self.__check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean) -> None:
        """Subtract a per-channel mean (K,) or an elementwise mean (K x H x W, or H x W for one channel).
        An elementwise mean of another height and width (a 256 x 256 ImageNet mean for a 227 x 227 input)
        is resized to the input's, bilinearly, as pycaffe does."""
        self.__check_input(in_)
        mean = np.asarray(mean)
        channels, in_hw = self.inputs[in_][1], tuple(self.inputs[in_][2:])
        if mean.ndim == 1:
            if mean.shape[0] != channels:
                raise ValueError(f"Mean channels incompatible with input: {mean.shape[0]} channels, the input "
                                 f"has {channels}")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            shape = (1,) + mean.shape if mean.ndim == 2 else mean.shape
            if len(shape) != 3:
                raise ValueError(f"Mean shape invalid: {mean.shape} (expected (K,), (K, H, W) or (H, W))")
            if shape[0] != channels:
                raise ValueError(f"Mean shape incompatible with input shape: {mean.shape} has {shape[0]} "
                                 f"channel(s), the input {self.inputs[in_][1:]} has {channels}")
            if shape[1:] != in_hw:
                resized = resize_image(mean.reshape(shape).transpose(1, 2, 0), in_hw)
                mean = resized.transpose(2, 0, 1).astype(mean.dtype if mean.dtype.kind == "f" else np.float32)
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale) -> None:
        """Scale applied last, after mean subtraction (e.g. 0.017 for some models)."""
        self.__check_input(in_)
        self.input_scale[in_] = scale


# -- images -------------------------------------------------------------------------------------------------

def load_image(filename, color: bool = True) -> np.ndarray:
    """An image file as H x W x 3 (color) or H x W x 1 float32 in [0, 1]. Needs Pillow."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(f"caffe.io.load_image('{filename}') needs Pillow to decode images: "
                          f"pip install pillow (or caffe-net[images])") from None
    with Image.open(filename) as im:
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            raw = np.asarray(im, dtype=np.float64)
            img = raw / (65535.0 if im.mode.startswith("I;16") else max(float(raw.max()), 1.0))
            if color:
                img = np.repeat(img[:, :, np.newaxis], 3, axis=2)
        elif im.mode == "F":
            img = np.asarray(im, dtype=np.float64)
            if color:
                img = np.repeat(img[:, :, np.newaxis], 3, axis=2)
        else:
            img = np.asarray(im.convert("RGB" if color else "L"), dtype=np.float64) / 255.0
    img = img.astype(np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
    return img


def _axis_weights(n_in: int, n_out: int, order: int):
    """Source indices and weights along one axis (pixel-center alignment, edges clamped)."""
    pos = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    if order == 0:
        idx = np.clip(np.floor(pos + 0.5).astype(np.int64), 0, n_in - 1)
        return idx, idx, np.zeros(n_out)
    pos = np.clip(pos, 0, n_in - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, pos - lo


def resize_image(im, new_dims, interp_order: int = 1) -> np.ndarray:
    """Resize an H x W x K image to new_dims (height, width): bilinear (order 1) or nearest (order 0)."""
    im = np.asarray(im)
    if im.ndim != 3:
        raise ValueError(f"resize_image expects an H x W x K image, got shape {im.shape}")
    if interp_order not in (0, 1):
        raise ValueError(f"resize_image: interp_order must be 0 (nearest) or 1 (bilinear), got {interp_order}")
    new_h, new_w = (int(d) for d in new_dims[:2])
    if new_h <= 0 or new_w <= 0:
        raise ValueError(f"resize_image: new dimensions must be positive, got {tuple(new_dims)}")
    im_min, im_max = im.min(), im.max()
    if im_max == im_min:  # a constant image stays constant
        return np.full((new_h, new_w, im.shape[-1]), im_min, dtype=np.float32)
    src = im.astype(np.float64, copy=False)
    y0, y1, wy = _axis_weights(im.shape[0], new_h, interp_order)
    x0, x1, wx = _axis_weights(im.shape[1], new_w, interp_order)
    wy = wy[:, None, None]
    wx = wx[None, :, None]
    rows = src[y0] * (1 - wy) + src[y1] * wy
    out = rows[:, x0] * (1 - wx) + rows[:, x1] * wx
    return out.astype(np.float32)


def oversample(images, crop_dims) -> np.ndarray:
    """10 crops per image (4 corners, center, and their mirrors), as (10 * N) x h x w x K float32."""
    images = [np.asarray(im) for im in images]
    im_shape = np.array(images[0].shape)
    crop_dims = np.array(crop_dims, dtype=int)
    h_starts = (0, im_shape[0] - crop_dims[0])
    w_starts = (0, im_shape[1] - crop_dims[1])
    crops_ix = [(i, j, i + crop_dims[0], j + crop_dims[1]) for i in h_starts for j in w_starts]
    center = im_shape[:2] / 2.0
    crops_ix.append(tuple(np.concatenate([center - crop_dims / 2.0, center + crop_dims / 2.0]).astype(int)))
    crops = np.empty((10 * len(images), crop_dims[0], crop_dims[1], im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for y0, x0, y1, x1 in crops_ix:
            crops[ix] = im[y0:y1, x0:x1, :]
            ix += 1
        crops[ix:ix + 5] = crops[ix - 5:ix, :, ::-1, :]  # mirrored copies
        ix += 5
    return crops
