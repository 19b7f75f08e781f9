"""Deconvolution: the transpose of Convolution (Caffe's DeconvolutionLayer).

Forward is Convolution's backward-data pass: top = col2im(W^T @ bottom) + b, with
    top spatial = stride * (bottom - 1) + dilation * (kernel - 1) + 1 - 2 * pad
and the weight blob (channels, num_output / group, *kernel). Backward lowers the
top diff once per block and uses it both for the weight gradient and for the bottom
diff (Caffe's skip_im2col). The plans are Convolution's (conv_base), sides swapped.
"""
from caffe.layers.conv_base import BaseConvolutionLayer, kernel_extent
from caffe.layers.registry import register_layer


@register_layer("Deconvolution")
class DeconvolutionLayer(BaseConvolutionLayer):
    reverse_dimensions = True

    def compute_output_shape(self, in_shape, blob_shape):
        out = []
        for i, (n, k, s, p, d) in enumerate(zip(in_shape, self.kernel_shape, self.stride, self.pad,
                                                 self.dilation)):
            size = s * (n - 1) + kernel_extent(k, d) - 2 * p
            if size < 1:
                raise self.error(f"output size {size} on spatial axis {i} is not positive: bottom shape "
                                 f"{blob_shape}, kernel_size {k}, stride {s}, pad {p}, dilation {d}")
            out.append(size)
        return tuple(out)

    def _im_shape(self):  # the top (image side)
        return (self.num, self.num_output) + self.geom.im_shape

    def forward_xp(self, xp, bottom, top):
        weight = self.blobs[0].data_xp(xp)
        P = self.geom.col_count
        for i in range(len(bottom)):
            x = bottom[i].data_xp(xp).reshape(self.num, self.channels, P)
            y = top[i].mutable_data_xp(xp).reshape(self._im_shape())
            self.conv_backward(xp, x, weight, im_diff=y)
            if self.bias_term:
                y3 = y.reshape(self.num, self.num_output, -1)
                y3 += self.blobs[1].data_xp(xp).reshape(1, self.num_output, 1)

    def backward_xp(self, xp, top, propagate_down, bottom):
        weight = self.blobs[0].data_xp(xp)
        want_w = self.param_propagate_down(0)
        want_b = self.bias_term and self.param_propagate_down(1)
        weight_diff = self.blobs[0].mutable_diff_xp(xp) if want_w else None
        P = self.geom.col_count
        for i in range(len(top)):
            want_x = bool(propagate_down[i])
            dy = top[i].diff_xp(xp).reshape(self._im_shape())
            if want_b:
                bias_diff = self.blobs[1].mutable_diff_xp(xp)
                bias_diff += dy.reshape(self.num, self.num_output, -1).sum(axis=(0, 2))
            if not (want_w or want_x):
                continue
            x = bottom[i].data_xp(xp).reshape(self.num, self.channels, P)
            dx = bottom[i].mutable_diff_xp(xp).reshape(self.num, self.channels, P) if want_x else None
            self.conv_backward(xp, x, weight, im=dy, weight_diff=weight_diff, fwd_out=dx)
