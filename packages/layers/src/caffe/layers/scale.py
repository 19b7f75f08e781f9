"""Scale: top = bottom[0] * s (+ bias), s broadcast over bottom[0]'s axes [axis, axis + s.num_axes).

s is bottom[1] (two bottoms) or a learned blob of shape bottom[0].shape[axis:axis+num_axes]
(num_axes = -1: to the end; 0: a scalar), filled by scale_param.filler (default constant 1).
bias_term adds a learned bias through an internal Bias layer, as Caffe does: its blob comes after the
scale blob (blobs = [scale, bias] with one bottom, [bias] with two). May run in place (the bottom data
is kept for the scale gradient). Parameter gradients accumulate; bottom gradients are overwritten.
"""
from caffe.blob import Blob
from caffe.layers import filler
from caffe.layers.bias import broadcast_dims, param_shape
from caffe.layers.layer import Layer, dtype_of
from caffe.layers.registry import create_layer, register_layer


@register_layer("Scale")
class ScaleLayer(Layer):
    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.scale_param
        self.bias_layer = None
        if len(bottom) == 1 and not self.blobs:
            shape = param_shape(self, bottom[0], p.axis, p.num_axes, "scale_param")
            s = Blob(list(shape), dtype=dtype_of(bottom))
            if p.HasField("filler"):
                filler.fill(s, p.filler)
            else:
                filler.fill(s, filler.filler_param("constant", value=1.0))
            self.blobs = [s]
        if p.bias_term:
            bp = type(self.layer_param)()
            bp.CopyFrom(self.layer_param)
            bp.type = "Bias"
            del bp.blobs[:]
            bp.bias_param.axis = p.axis
            bp.bias_param.num_axes = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            bp.bias_param.filler.CopyFrom(p.bias_filler)
            self.bias_layer = create_layer(bp)
            preloaded = len(self.blobs) + len(bottom) >= 3  # the bias came with the caffemodel
            if preloaded:
                self.bias_layer.blobs = [self.blobs[-1]]
            self.bias_layer.SetUp([bottom[0]], top)
            if preloaded:
                self.bias_param_id = len(self.blobs) - 1
            else:
                self.bias_param_id = len(self.blobs)
                self.blobs.append(self.bias_layer.blobs[0])
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        what = "bottom[1] (the scale)" if len(bottom) > 1 else "the scale blob"
        self.outer, self.dim, self.inner = broadcast_dims(self, bottom[0], self._scale(bottom),
                                                          self.layer_param.scale_param.axis, what)
        if bottom[0] is not top[0]:
            top[0].reshape_like(bottom[0])
        if self.bias_layer is not None:
            self.bias_layer.reshape([top[0]], top)

    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        xr = x.reshape(self.outer, self.dim, self.inner)
        # In place, the top overwrites x, which the scale gradient needs: keep a copy (Caffe's temp_).
        self._x = xr.copy() if bottom[0] is top[0] else None
        s = self._scale(bottom).data_xp(xp).reshape(1, self.dim, 1)
        top[0].mutable_data_xp(xp)[...] = (xr * s).reshape(x.shape)
        if self.bias_layer is not None:
            self.bias_layer.forward_xp(xp, [top[0]], top)

    def backward_xp(self, xp, top, propagate_down, bottom):
        if self.bias_layer is not None and self.param_propagate_down(self.bias_param_id):
            self.bias_layer.backward_xp(xp, top, [False], [top[0]])
        learned = len(bottom) == 1
        dy = top[0].diff_xp(xp).reshape(self.outer, self.dim, self.inner)
        if (learned and self.param_propagate_down(0)) or (not learned and propagate_down[1]):
            x = self._x if self._x is not None else bottom[0].data_xp(xp).reshape(dy.shape)
            ds = (dy * x).sum(axis=(0, 2))
            diff = self._scale(bottom).mutable_diff_xp(xp)
            if learned:
                diff += ds.reshape(diff.shape)
            else:
                diff[...] = ds.reshape(diff.shape)
        if propagate_down[0]:
            s = self._scale(bottom).data_xp(xp).reshape(1, self.dim, 1)
            dx = dy * s
            bottom[0].mutable_diff_xp(xp)[...] = dx.reshape(bottom[0].shape)
