"""caffe.layers: the Layer base, the registry, fillers, the gradient checker and every layer type.

Every module in this package (other than the machinery below) defines layers and
registers them on import; they are all imported here so that the registry is full.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from caffe.layers.layer import Layer as _BaseLayer, LayerError, NeuronLayer, LossLayer
from caffe.layers.registry import (register_layer, create_layer, layer_class, layer_type_list,
                                   UnknownLayerTypeError)
from caffe.layers import filler
from caffe.layers.gradient_check import GradientChecker, GradientCheckError

_MACHINERY = {"layer", "registry", "filler", "gradient_check", "testing", "strategies", "kernels"}
for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in _MACHINERY and not _m.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_m.name}")

from caffe.layers.python_layer import Layer  # noqa: E402  pycaffe's caffe.Layer (for Python layers)

__all__ = ["Layer", "LayerError", "NeuronLayer", "LossLayer", "register_layer", "create_layer",
           "layer_class", "layer_type_list", "UnknownLayerTypeError", "filler", "GradientChecker",
           "GradientCheckError"]
