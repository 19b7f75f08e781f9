"""BNLL (binomial normal log likelihood): y = log(1 + exp(x)).

Forward in Caffe's overflow-safe form: x + log(1 + exp(-x)) for x > 0, else
log(1 + exp(x)), i.e. max(x, 0) + log1p(exp(-|x|)). Backward:
dy/dx = e / (e + 1) with e = exp(min(x, 50)) (Caffe's kBNLL_THRESHOLD).
"""
from caffe.layers.layer import NeuronLayer
from caffe.layers.registry import register_layer

BNLL_THRESHOLD = 50.0


@register_layer("BNLL")
class BNLLLayer(NeuronLayer):
    def forward_xp(self, xp, bottom, top):
        x = bottom[0].data_xp(xp)
        if bottom[0] is top[0]:
            self._saved_x = x.copy()  # in place: keep the input for backward
        top[0].mutable_data_xp(xp)[...] = xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward_xp(self, xp, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self._saved_x if bottom[0] is top[0] else bottom[0].data_xp(xp)
        dy = top[0].diff_xp(xp)
        e = xp.exp(xp.minimum(x, BNLL_THRESHOLD))
        bottom[0].mutable_diff_xp(xp)[...] = dy * e / (e + 1)
