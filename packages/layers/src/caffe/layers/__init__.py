"""caffe.layers: the Layer base, the registry, fillers, the gradient checker and every layer type.

Every module in this package (other than the machinery below) defines layers and
registers them on import; they are all imported here so that the registry is full.
"""
import importlib as _importlib
import os as _os
import pkgutil as _pkgutil

# The Cython kernels' OpenMP threads and OpenBLAS's own threads share the cores. OpenMP threads that
# spin-wait between parallel regions starve OpenBLAS's (and vice versa): LeNet ran 30x slower on 2 cores.
# Passive waiting must be chosen before libgomp loads, i.e. before the first kernel module is imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from caffe.layers.layer import Layer as _BaseLayer, LayerError, NeuronLayer, LossLayer
from caffe.layers.registry import (register_layer, create_layer, layer_class, layer_type_list,
                                   UnknownLayerTypeError)
from caffe.layers import filler
from caffe.layers.gradient_check import GradientChecker, GradientCheckError

_MACHINERY = {"layer", "registry", "filler", "gradient_check", "testing", "strategies"}
for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in _MACHINERY and not _m.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_m.name}")

from caffe.layers.python_layer import Layer  # noqa: E402  pycaffe's caffe.Layer (for Python layers)

__all__ = ["Layer", "LayerError", "NeuronLayer", "LossLayer", "register_layer", "create_layer",
           "layer_class", "layer_type_list", "UnknownLayerTypeError", "filler", "GradientChecker",
           "GradientCheckError"]
