"""ELU: y = x for x > 0, alpha * (exp(x) - 1) otherwise (elu_param.alpha, default 1).

Backward as Caffe: dy/dx = 1 for x > 0, alpha + y otherwise.
"""
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer


@register_layer("ELU")
class ELULayer(NeuronLayer):
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if bottom[0] is top[0]:
            self._saved_x = x.copy()  # in place: backward needs the input's sign
        alpha = self.layer_param.elu_param.alpha
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + alpha * xp.expm1(xp.minimum(x, 0))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self._saved_x if bottom[0] is top[0] else bottom[0].data_xp(xp)
        y = top[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        alpha = self.layer_param.elu_param.alpha
        bottom[0].mutable_diff_xp(xp)[...] = dy * xp.where(x > 0, 1, alpha + y)
