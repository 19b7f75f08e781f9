"""Eltwise: element-wise PROD, SUM (with one coeff per bottom) or MAX of bottoms of the same shape.

MAX keeps Caffe's tie rule (bottom[1] wins a tie with bottom[0]; later bottoms need to be strictly
larger) and routes the gradient through the winner only. PROD's gradient is the product of the other
bottoms (stable_prod_grad, the default) or top / bottom[i].
"""
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


@register_layer("Eltwise")
class EltwiseLayer(Layer):
    min_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        from caffe.proto import caffe_pb2
        p = self.layer_param.eltwise_param
        E = caffe_pb2.EltwiseParameter
        self.op = p.operation
        coeff = list(p.coeff)
        self.check(not coeff or len(coeff) == len(bottom),
                   f"Eltwise Layer takes one coefficient per bottom blob: {len(coeff)} eltwise_param.coeff "
                   f"for {len(bottom)} bottoms")
        self.check(not (self.op == E.PROD and coeff),
                   "Eltwise layer only takes coefficients for summation (operation PROD has coeff)")
        self.coeffs = coeff or [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.PROD, self.SUM, self.MAX = E.PROD, E.SUM, E.MAX

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"all bottoms must have the same shape: bottom[0] has shape "
                                 f"{bottom[0].shape}, bottom[{i}] has shape {b.shape}")
        top[0].reshape_like(bottom[0])

    def forward_xp(self, xp, bottom, top):
        xs = [b.data_xp(xp) for b in bottom]
        if self.op == self.PROD:
            y = xs[0] * xs[1]
            for x in xs[2:]:
                y = y * x
        elif self.op == self.SUM:
            y = self.coeffs[0] * xs[0]
            for c, x in zip(self.coeffs[1:], xs[1:]):
                y = y + c * x
        else:
            first = xs[0] > xs[1]
            y = xp.where(first, xs[0], xs[1])
            mask = xp.where(first, 0, 1).astype(xp.int32)
            for i, x in enumerate(xs[2:], 2):
                better = x > y
                y = xp.where(better, x, y)
                mask = xp.where(better, i, mask).astype(xp.int32)
            self.mask = mask
        top[0].mutable_data_xp(xp)[...] = y

    def backward_xp(self, xp, top, propagate_down, bottom):
        dy = top[0].diff_xp(xp)
        y = top[0].data_xp(xp)
        grads = {}
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            if self.op == self.PROD:
                if self.stable_prod_grad:
                    others = [o.data_xp(xp) for j, o in enumerate(bottom) if j != i]
                    g = others[0]
                    for o in others[1:]:
                        g = g * o
                else:
                    g = y / b.data_xp(xp)
                grads[i] = g * dy
            elif self.op == self.SUM:
                grads[i] = self.coeffs[i] * dy
            else:
                grads[i] = xp.where(self.mask == i, dy, 0)
        # Write after computing all: a bottom may share memory with the top (in place).
        for i, g in grads.items():
            bottom[i].mutable_diff_xp(xp)[...] = g
