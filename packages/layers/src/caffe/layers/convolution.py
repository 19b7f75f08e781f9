"""Convolution: N-d, grouped, dilated convolution (Caffe's ConvolutionLayer).

top[i] = W * bottom[i] + b for every bottom/top pair, all pairs sharing one set of
weights. conv_base picks the plan: on the CPU a 1x1 GEMM, a direct kernel for
depthwise / small-group layers, or a cache-blocked lowering (conv_cpu); elsewhere
the batched lowering with one GEMM per group, whose forward keeps its column buffer
for the backward's weight gradient instead of lowering the same bottom again (Caffe
recomputes it): the bottom's data is what it was at forward time in a net's
forward/backward, so the result is the same.
"""
from caffe.layers.conv_base import BaseConvolutionLayer, conv_output_shape
from caffe.layers.registry import register_layer


@register_layer("Convolution")
class ConvolutionLayer(BaseConvolutionLayer):
    reverse_dimensions = False

    def compute_output_shape(self, in_shape, blob_shape):
        return conv_output_shape(self, in_shape, self.kernel_shape, self.stride, self.pad,
                                 self.dilation, blob_shape)

    def _im_shape(self):
        return (self.num, self.channels) + self.geom.im_shape

    def forward_xp(self, xp, bottom, top):
        weight = self.blobs[0].data_xp(xp)
        bias = self.blobs[1].data_xp(xp) if self.bias_term else None
        P = self.geom.col_count
        for i in range(len(bottom)):
            x = bottom[i].data_xp(xp).reshape(self._im_shape())
            y = top[i].mutable_data_xp(xp).reshape(self.num, self.num_output, P)
            self.conv_forward(xp, x, y, weight, bias, keep=i)

    def backward_xp(self, xp, top, propagate_down, bottom):
        weight = self.blobs[0].data_xp(xp)
        want_w = self.param_propagate_down(0)
        want_b = self.bias_term and self.param_propagate_down(1)
        weight_diff = self.blobs[0].mutable_diff_xp(xp) if want_w else None
        bias_diff = self.blobs[1].mutable_diff_xp(xp) if want_b else None
        P = self.geom.col_count
        for i in range(len(top)):
            want_x = bool(propagate_down[i])
            if not (want_w or want_b or want_x):
                continue
            dy = top[i].diff_xp(xp).reshape(self.num, self.num_output, P)
            x = bottom[i].data_xp(xp).reshape(self._im_shape()) if want_w else None
            dx = bottom[i].mutable_diff_xp(xp).reshape(self._im_shape()) if want_x else None
            self.conv_backward(xp, dy, weight, im=x, weight_diff=weight_diff, im_diff=dx,
                               bias_diff=bias_diff, kept=i)
