"""Eltwise: element-wise PROD, SUM (with one coeff per bottom) or MAX of bottoms of the same shape.

MAX keeps Caffe's tie rule (bottom[1] wins a tie with bottom[0]; later bottoms need to be strictly
larger) and routes the gradient through the winner only; the winner's index lives in the
max_idx_ blob (int32, Caffe's name). PROD's gradient is the product of the other bottoms
(stable_prod_grad, the default) or top / bottom[i]. CPU: one kernel pass each way
(caffe.layers.kernels.elementwise: every bottom read once, the top written once).
"""
import numpy as np

from caffe.layers import _cpu
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
        self._coeff_array = np.asarray(self.coeffs, dtype=np.float64)
        self.stable_prod_grad = p.stable_prod_grad
        self.PROD, self.SUM, self.MAX = E.PROD, E.SUM, E.MAX
        self.max_idx_ = None

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"all bottoms must have the same shape: bottom[0] has shape "
                                 f"{bottom[0].shape}, bottom[{i}] has shape {b.shape}")
        top[0].reshape_like(bottom[0])
        if self.op == self.MAX:
            _cpu.state_blob(self, "max_idx_", bottom[0], np.int32)

    # The kernels' operation codes are EltwiseParameter's (PROD 0, SUM 1, MAX 2).
    def forward_cpu(self, bottom, top):
        if not _cpu.usable(_cpu.elementwise, *bottom, top[0]):
            return self.forward_xp(np, bottom, top)
        xs = [_cpu.flat(b.cpu_data()) for b in bottom]
        mask = _cpu.flat(self.max_idx_.mutable_cpu_data()) if self.op == self.MAX else _cpu.EMPTY_INT
        _cpu.elementwise.eltwise_forward(self.op, xs, self._coeff_array, _cpu.flat(top[0].mutable_cpu_data()), mask)

    def backward_cpu(self, top, propagate_down, bottom):
        if not _cpu.usable(_cpu.elementwise, *bottom, top[0]):
            return self.backward_xp(np, top, propagate_down, bottom)
        if not any(propagate_down):
            return
        dt = top[0].dtype
        prod = self.op == self.PROD
        xs = [_cpu.flat(b.cpu_data()) if prod else None for b in bottom]
        y = _cpu.flat(top[0].cpu_data()) if prod and not self.stable_prod_grad else _cpu.empty(dt)
        mask = _cpu.flat(self.max_idx_.cpu_data()) if self.op == self.MAX else _cpu.EMPTY_INT
        dxs = [_cpu.flat(b.mutable_cpu_diff()) if propagate_down[i] else None for i, b in enumerate(bottom)]
        _cpu.elementwise.eltwise_backward(self.op, xs, dxs, self._coeff_array, y, _cpu.flat(top[0].cpu_diff()),
                                          mask, self.stable_prod_grad)

    def forward_xp(self, xp, bottom, top):
        xs = [b.data_xp(xp) for b in bottom]
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: SUM, MAX: a pass per bottom past the first
        if self.op == self.PROD:
            y = xs[0] * xs[1]
            for x in xs[2:]:
                y = y * x
        elif self.op == self.SUM:
            if cuda_elementwise.eltwise_sum(xp, self.coeffs, xs, top[0].mutable_data_xp(xp)):
                return
            y = self.coeffs[0] * xs[0]
            for c, x in zip(self.coeffs[1:], xs[1:]):
                y = y + c * x
        elif cuda_elementwise.eltwise_max(xp, xs, top[0].mutable_data_xp(xp), self.max_idx_.mutable_data_xp(xp)):
            return  # a real GPU: one pass for two bottoms, one per further bottom
        else:
            first = xs[0] > xs[1]
            y = xp.where(first, xs[0], xs[1])
            mask = xp.where(first, 0, 1).astype(xp.int32)
            for i, x in enumerate(xs[2:], 2):
                better = x > y
                y = xp.where(better, x, y)
                mask = xp.where(better, i, mask).astype(xp.int32)
            self.max_idx_.mutable_data_xp(xp)[...] = mask
        top[0].mutable_data_xp(xp)[...] = y

    def backward_xp(self, xp, top, propagate_down, bottom):
        dy = top[0].diff_xp(xp)
        from caffe.layers.kernels import cuda_elementwise  # a real GPU: SUM and MAX in one pass per bottom
        if self.op in (self.SUM, self.MAX):
            dxs = [b.mutable_diff_xp(xp) if d else None for b, d in zip(bottom, propagate_down)]
            if self.op == self.SUM and cuda_elementwise.eltwise_sum_backward(xp, self.coeffs, dy, dxs):
                return
            if self.op == self.MAX and cuda_elementwise.eltwise_max_backward(xp, dy, self.max_idx_.data_xp(xp), dxs):
                return
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
                grads[i] = xp.where(self.max_idx_.data_xp(xp) == i, dy, 0)
        # Write after computing all: a bottom may share memory with the top (in place).
        for i, g in grads.items():
            bottom[i].mutable_diff_xp(xp)[...] = g
