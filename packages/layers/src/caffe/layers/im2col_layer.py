"""Im2col: the convolution lowering as a layer (Caffe's Im2colLayer).

Reads kernel/stride/pad/dilation/axis/force_nd_im2col from convolution_param.
top shape: bottom's with the channel axis multiplied by prod(kernel) and each
spatial axis replaced by the convolution output size; top[n] is image n's column
buffer (C * prod(kernel), *out), rows in Caffe's (channel, kernel offset) order.
Backward is col2im. The whole batch is lowered in one kernel call (image layout).
"""
from __future__ import annotations

import math

from caffe.layers.conv_base import ConvGeometry, col2im, conv_output_shape, im2col, parse_conv_spatial
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Im2col")
class Im2colLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        (self.channel_axis, self.num_spatial_axes, self.kernel_shape, self.stride, self.pad,
         self.dilation) = parse_conv_spatial(self, bottom[0])
        self.check(self.num_spatial_axes >= 1, f"Im2col needs at least one spatial axis after the channel "
                                               f"axis {self.channel_axis}: bottom[0] has shape {bottom[0].shape}")
        self.force_nd_im2col = bool(self.layer_param.convolution_param.force_nd_im2col)

    def reshape(self, bottom, top):
        x = bottom[0]
        axis, nsp = self.channel_axis, self.num_spatial_axes
        self.check(x.num_axes == axis + 1 + nsp, f"bottom num_axes may not change: bottom[0] has shape "
                                                 f"{x.shape}, the layer was set up for {axis + 1 + nsp} axes")
        spatial = x.shape[axis + 1:]
        out = conv_output_shape(self, spatial, self.kernel_shape, self.stride, self.pad, self.dilation,
                                x.shape)
        self.channels = x.shape[axis]
        self.num = math.prod(x.shape[:axis])
        self.geom = ConvGeometry(self.kernel_shape, self.stride, self.pad, self.dilation, spatial, out)
        top[0].reshape(x.shape[:axis] + (self.channels * self.geom.kernel_count,) + out)

    def _im(self, arr):
        return arr.reshape((self.num, self.channels) + self.geom.im_shape)

    def forward_xp(self, xp, bottom, top):
        im2col(xp, self._im(bottom[0].data_xp(xp)), top[0].mutable_data_xp(xp), self.geom, "image",
               self.force_nd_im2col)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[0]:
            col2im(xp, top[0].diff_xp(xp), self._im(bottom[0].mutable_diff_xp(xp)), self.geom, "image",
                   self.force_nd_im2col)
