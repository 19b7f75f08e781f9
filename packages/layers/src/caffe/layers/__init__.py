"""caffe.layers: the Layer base, the registry, fillers, the gradient checker and every layer type.

Every module in this package (other than the machinery below) defines layers and
registers them on import; they are all imported here so that the registry is full.

It is also pycaffe's `from caffe import layers as L`: any attribute named like a layer type (a
capital first letter) that the package does not define is a NetSpec layer builder
(`L.Convolution(n.data, num_output=20)`, see caffe.net_spec); the implementation modules stay
importable as before (`caffe.layers.convolution`, `from caffe.layers import testing`).
"""
import importlib as _importlib
import pkgutil as _pkgutil

from caffe.layers.layer import Layer as _BaseLayer, LayerError, NeuronLayer, LossLayer
from caffe.layers.registry import (register_layer, create_layer, layer_class, layer_type_list,
                                   UnknownLayerTypeError)
from caffe.layers import filler
from caffe.layers.gradient_check import GradientChecker, GradientCheckError

_SUBMODULES = {_m.name for _m in _pkgutil.iter_modules(__path__)}
_MACHINERY = {"layer", "registry", "filler", "gradient_check", "testing", "strategies", "kernels"}
for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in _MACHINERY and not _m.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_m.name}")

from caffe.layers.python_layer import Layer  # noqa: E402  pycaffe's caffe.Layer (for Python layers)

__all__ = ["Layer", "LayerError", "NeuronLayer", "LossLayer", "register_layer", "create_layer",
           "layer_class", "layer_type_list", "UnknownLayerTypeError", "filler", "GradientChecker",
           "GradientCheckError"]


def __getattr__(name):
    # submodules not imported above (testing, strategies, ...) load on first use, as import would
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    # pycaffe's L.<Type>: layer types are CamelCase; lowercase and underscore names stay ordinary
    # attributes so module probes (load_tests, __wrapped__, ...) are not mistaken for layers
    if name[:1].isupper():
        from caffe.net_spec import layers as _netspec_layers
        return getattr(_netspec_layers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (NetSpec layer builders are layer type "
                         f"names, with a capital first letter: L.Convolution; caffe.net_spec.layers takes any name)")
