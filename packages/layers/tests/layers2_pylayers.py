"""User Python layers for test_layers2_python.py (imported by python_param.module)."""
import numpy as np

import caffe


class ScaledSum(caffe.Layer):
    """top = w * bottom, with w a learned blob made with self.blobs.add_blob; param_str = the initial w."""

    def setup(self, bottom, top):
        self.seen_param_str = self.param_str
        self.seen_phase = self.phase
        if len(self.blobs) == 0:
            self.blobs.add_blob(1)
            self.blobs[0].data[...] = float(self.param_str or 1.0)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += np.vdot(top[0].diff, bottom[0].data)
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff


class WithInit(caffe.Layer):
    """A user layer with its own __init__ (param_str must already be set when it runs)."""

    def __init__(self):
        super().__init__()
        self.param_str_at_init = self.param_str

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff
