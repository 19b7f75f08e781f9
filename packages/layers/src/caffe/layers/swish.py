"""Swish: y = x * sigmoid(beta * x) (swish_param.beta, default 1).

dy/dx = beta * y + sigmoid(beta * x) * (1 - beta * y), from the top data and the sigmoid output.
In place, the forward keeps the sigmoid output in the sigmoid_output_ blob (as Caffe), since the
bottom is gone by backward. Out of place in float32 where the kernels' sigmoid is cheap (the
AVX-512 build), the CPU forward writes the top only and the backward recomputes sigmoid(beta * x)
from the bottom with the forward's own loop (the same bits, so the same bottom diff as from the
kept blob): 2 units of memory traffic forward instead of 3, backward 4 as before (x for s).
A forward through the array-module path (forward_xp: the GPU's) keeps the blob in either case;
_sigmoid_kept says which the last forward did. CPU: one kernel pass each way.
"""
import numpy as np

from caffe.layers import _cpu
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer
from caffe.layers.sigmoid import sigmoid_xp


@register_layer("Swish")
class SwishLayer(NeuronLayer):
    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        _cpu.state_blob(self, "sigmoid_output_", bottom[0])

    _sigmoid_kept = True  # whether sigmoid_output_ holds the last forward's sigmoid (else: recompute from x)

    @staticmethod
    def _keeps_sigmoid(bottom, top):
        # In place the bottom is gone by backward; elsewhere the kernels say whether recomputing is cheaper
        # (the AVX-512 build's float32 exp: yes; libmvec's tanh: no, see kernels.elementwise)
        return bottom[0] is top[0] or not (bottom[0].dtype == np.float32 and
                                           getattr(_cpu.elementwise, "SWISH_RECOMPUTES_FLOAT32", False))

    def forward_cpu(self, bottom, top):
        keep = self._keeps_sigmoid(bottom, top)
        if _cpu.neuron_forward(self, _cpu.SWISH, bottom, top, a=self.layer_param.swish_param.beta,
                               aux=self.sigmoid_output_ if keep else None):
            self._sigmoid_kept = keep
        else:
            self.forward_xp(np, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        kept = self._sigmoid_kept
        if not _cpu.neuron_backward(self, _cpu.SWISH, top, bottom, reads_x=None if kept else "bottom", reads_y=True,
                                    aux=self.sigmoid_output_ if kept else None,
                                    a=self.layer_param.swish_param.beta):
            self.backward_xp(np, top, propagate_down, bottom)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        beta = self.layer_param.swish_param.beta
        s = self.sigmoid_output_.mutable_data_xp(xp)
        self._sigmoid_kept = True
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.swish_forward(xp, x, beta, s, top[0].mutable_data_xp(xp)):
            return
        s[...] = sigmoid_xp(xp, x * beta)
        top[0].mutable_data_xp(xp)[...] = x * s

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        beta = self.layer_param.swish_param.beta
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        if self._sigmoid_kept:
            s = self.sigmoid_output_.data_xp(xp)
        else:  # the CPU forward left it out (out of place): the same function of the bottom
            s = sigmoid_xp(xp, bottom[0].data_xp(xp) * beta)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: one pass
        if cuda_elementwise.swish_backward(xp, y, s, dy, beta, bottom[0].mutable_diff_xp(xp)):
            return
        bottom[0].mutable_diff_xp(xp)[...] = dy * (beta * y + s * (1 - beta * y))
