"""pycaffe's `caffe.classifier` module: the same module object as caffe.net.classifier."""
import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module("caffe.net.classifier")
