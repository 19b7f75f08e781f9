"""Converters from Caffe layer types to ONNX nodes.

`@converter("Type", ..., check=fn)` registers `convert(ctx)` (ctx: a builder.LayerContext) that writes every
top of the layer; `check(ctx)` (optional) returns why this particular layer cannot be exported (a
parameter setting without an ONNX equivalent), or None. Layer types without a converter are refused
with the reason from `why_unsupported`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Converter:
    convert: Callable
    check: Callable | None = None


CONVERTERS: dict[str, Converter] = {}

DATA_LAYERS = {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData", "AnnotatedData",
               "VideoData"}


def converter(*types: str, check: Callable | None = None):
    def register(fn):
        for t in types:
            CONVERTERS[t] = Converter(fn, check)
        return fn
    return register


def supported_layer_types() -> list[str]:
    return sorted(CONVERTERS)


def why_unsupported(layer_type: str) -> str:
    """Why a layer type without a converter has no ONNX form, in words a user can act on."""
    if layer_type in DATA_LAYERS:
        return "a data layer: a deploy net takes its input from an Input layer instead"
    if layer_type.endswith("Loss") or layer_type in ("Accuracy",):
        return "a loss/metric layer needs labels: export the deploy net, without it"
    if layer_type == "Python":
        return "a Python layer runs arbitrary Python code, which ONNX cannot express"
    if layer_type == "HDF5Output":
        return "it writes files as a side effect"
    return "no ONNX equivalent is implemented for this layer type"
