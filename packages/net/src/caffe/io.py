"""pycaffe's `caffe.io` module: the same module object as caffe.net.io (which holds the code), so
`import caffe.io`, `from caffe.io import Transformer` and `caffe.io.load_image` all work."""
import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module("caffe.net.io")
