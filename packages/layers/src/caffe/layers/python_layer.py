"""The `Python` layer type and pycaffe's `caffe.Layer` base for user layers.

A user layer derives from `caffe.Layer` and implements setup/reshape/forward/
backward(top, propagate_down, bottom). As in pycaffe, `param_str` and `phase`
are set before `setup`, and `self.blobs` holds the layer's own parameter blobs
(`self.blobs.add_blob(*shape)` appends one).
"""
from __future__ import annotations

import importlib

from caffe.blob import Blob
from caffe.layers.layer import Layer as _Layer
from caffe.layers.registry import register_layer


class BlobVec(list):
    """pycaffe's BlobVec: a list of Blobs with add_blob(*shape)."""

    def add_blob(self, *shape):
        self.append(Blob(*shape) if shape else Blob())


class Layer:
    """Base class for Python layers (pycaffe's caffe.Layer)."""

    param_str = ""
    phase = 0

    def __init__(self):
        self.blobs = BlobVec()

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


@register_layer("Python")
class PythonLayer(_Layer):
    """Wraps an instance of python_param.module.python_param.layer."""

    def __init__(self, layer_param):
        super().__init__(layer_param)
        pp = self.layer_param.python_param
        if not pp.module or not pp.layer:
            raise self.error("python_param needs both 'module' and 'layer'")
        try:
            module = importlib.import_module(pp.module)
        except ImportError as exc:
            raise self.error(f"python_param.module {pp.module!r} cannot be imported: {exc}") from None
        cls = getattr(module, pp.layer, None)
        if cls is None:
            raise self.error(f"python_param.layer {pp.layer!r} not found in module {pp.module!r}")
        try:
            self.impl = cls.__new__(cls)
            Layer.__init__(self.impl)
            # param_str and phase are visible before the user's __init__ and setup, as in pycaffe
            self.impl.param_str = pp.param_str
            self.impl.phase = self.phase
            init = getattr(cls, "__init__", None)
            if init is not None and init is not object.__init__ and init is not Layer.__init__:
                blobs = self.impl.blobs
                init(self.impl)
                if not isinstance(getattr(self.impl, "blobs", None), BlobVec):
                    self.impl.blobs = blobs
        except Exception as exc:
            raise self.error(f"cannot construct Python layer {pp.module}.{pp.layer}: {exc}") from exc
        if self.blobs:
            self.impl.blobs.extend(self.blobs)
        self.blobs = self.impl.blobs

    @property
    def share_in_parallel(self) -> bool:
        return self.layer_param.python_param.share_in_parallel

    def layer_setup(self, bottom, top):
        self.impl.setup(bottom, top)

    def reshape(self, bottom, top):
        self.impl.reshape(bottom, top)

    def forward_cpu(self, bottom, top):
        self.impl.forward(bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        self.impl.backward(top, propagate_down, bottom)

    def forward_gpu(self, bottom, top):
        self.impl.forward(bottom, top)

    def backward_gpu(self, top, propagate_down, bottom):
        self.impl.backward(top, propagate_down, bottom)
