"""pycaffe's coord_map: how the spatial coordinates of two NetSpec tops relate, and the Crop that aligns
them (FCN's `crop(n.upscore, n.data)`).

A coordinate map is (axis, scale a, shift b): output coordinate x_out relates to input coordinate x_in
by x_out = a * x_in + b, over the axes from `axis` on (None: any axis, for pointwise layers). Maps
compose along a path of layers and invert for the way back. Scale and shift are NumPy arrays with one
entry per spatial axis once a layer with per-axis parameters is met.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from caffe.net_spec import layers as L

__all__ = ["PASS_THROUGH_LAYERS", "UndefinedMapException", "AxisMismatchException", "conv_params",
           "crop_params", "coord_map", "compose", "inverse", "coord_map_from_to", "crop"]

# layers that leave coordinates as they are
PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Clip", "Dropout", "Eltwise", "ELU", "Exp",
                       "Log", "LRN", "MVN", "Power", "PReLU", "ReLU", "Scale", "Sigmoid", "Split", "Swish",
                       "TanH", "Threshold"]


class UndefinedMapException(Exception):
    """The layer has no coordinate map (InnerProduct, Reshape, ...): the walk stops there."""


class AxisMismatchException(Exception):
    """Two maps on different axes cannot be composed."""


def _layer_params(fn, message: str) -> dict:
    """The layer's parameters, whether given flat (kernel_size=3) or as message=dict(kernel_size=3)."""
    params = dict(fn.params)
    nested = params.pop(message, None)
    if isinstance(nested, dict):
        params.update(nested)
    return params


def _per_axis(params: dict, name: str, default) -> np.ndarray:
    """A spatial parameter as an array: `name` (scalar or list), or legacy name_h / name_w."""
    if f"{name}_h" in params or f"{name}_w" in params:
        if name in params:
            raise ValueError(f"give either {name} or {name}_h/{name}_w, not both")
        return np.array([params.get(f"{name}_h", default), params.get(f"{name}_w", default)])
    return np.array(params.get(name, default), ndmin=1)


def conv_params(fn):
    """(axis, stride, effective kernel extent, pad) of a Convolution, Deconvolution, Im2col or Pooling
    layer; the extent counts dilation: (kernel - 1) * dilation + 1."""
    params = _layer_params(fn, "pooling_param" if fn.type_name == "Pooling" else "convolution_param")
    if "kernel_size" not in params and "kernel_h" not in params:
        if params.get("global_pooling"):
            raise UndefinedMapException(f"{fn.type_name} with global_pooling has no coordinate map")
        raise ValueError(f"{fn.type_name}: no kernel_size to map coordinates through")
    axis = params.get("axis", 1)
    kernel = _per_axis(params, "kernel", None) if "kernel_h" in params else _per_axis(params, "kernel_size", 1)
    dilation = np.array(params.get("dilation", 1), ndmin=1)
    return (axis, _per_axis(params, "stride", 1), (kernel - 1) * dilation + 1, _per_axis(params, "pad", 0))


def crop_params(fn):
    """(axis, offset) of a Crop layer, with Crop's defaults (axis 2, offset 0)."""
    params = _layer_params(fn, "crop_param")
    return params.get("axis", 2), np.array(params.get("offset", 0), ndmin=1)


def coord_map(fn):
    """The (axis, scale, shift) map from a layer's bottom coordinates to its top coordinates."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, ks, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (ks - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, ks, pad = conv_params(fn)
        return axis, stride, (ks - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if fn.type_name == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # the map's axis is the last non-coordinate one
    raise UndefinedMapException(f"{fn.type_name} layers have no coordinate map")


def compose(base_map, next_map):
    """base_map followed by next_map: scales multiply, next's shift is scaled by base's scale."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        ax = ax2
    elif ax2 is None or ax1 == ax2:
        ax = ax1
    else:
        raise AxisMismatchException(f"cannot compose maps on axes {ax1} and {ax2}")
    return ax, a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The map back: x_in = x_out / a - b / a."""
    ax, a, b = coord_map
    return ax, 1 / a, -b / a


def _mappable_bottoms(top):
    # Crop maps only its first bottom; the second gives the shape
    inputs = top.fn.inputs
    return inputs[:1] if top.fn.type_name == "Crop" else inputs


def coord_map_from_to(top_from, top_to):
    """The (axis, scale, shift) map from top_from's coordinates to top_to's, through their nearest
    common ancestor. RuntimeError when no spatial path connects them."""
    def walk(start):
        """{ancestor top: map from ancestor coordinates to start's}, nearest first."""
        maps = {start: (None, 1, 0)}
        queue = deque([start])
        while queue:
            top = queue.popleft()
            try:
                step = coord_map(top.fn)
            except UndefinedMapException:
                continue
            for bottom in _mappable_bottoms(top):
                if bottom not in maps:
                    maps[bottom] = compose(maps[top], step)
                    queue.append(bottom)
        return maps

    from_maps = walk(top_from)
    for top, to_map in walk(top_to).items():
        if top in from_maps:
            return compose(to_map, inverse(from_maps[top]))
    raise RuntimeError("Could not compute map between tops; are they connected by spatial layers?")


def crop(top_from, top_to):
    """A Crop layer that crops top_from to top_to's extent, axis and offsets from their coordinate map.
    AssertionError when the scales differ or the offset is negative or fractional."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    assert (a == 1).all(), f"scale mismatch on crop (a = {a})"
    assert (b <= 0).all(), f"cannot crop negative offset (b = {b})"
    assert (np.round(b) == b).all(), f"cannot crop noninteger offset (b = {b})"
    axis = 2 if ax is None else ax + 1  # the first cropped axis
    return L.Crop(top_from, top_to, crop_param=dict(axis=int(axis), offset=[int(o) for o in -np.round(b)]))
