"""LSTMUnit: one LSTM time step on precomputed gate inputs (Caffe's lstm_unit_layer).

bottoms: c_prev (1, N, D), x (1, N, 4D) the gate pre-activations in Caffe's order i, f, o, g, and
cont (1, N) the sequence-continuation flags; tops: c (1, N, D) and h (1, N, D):
  i = sigmoid(x_i)  f = cont * sigmoid(x_f)  o = sigmoid(x_o)  g = tanh(x_g)
  c = f * c_prev + i * g       h = o * tanh(c)
cont = 0 starts a new sequence (c_prev is masked out). No gradient flows to cont.
Backward is the exact gradient (Caffe's GPU form; its CPU form agrees for cont in {0, 1}).
Backward's state lives in blobs, so a forward in one mode and a backward in the other agree: X_acts_
(Caffe's name) holds i, sigmoid(x_f), o, g and tanh(c) side by side (1, N, 5D); c_prev and cont are read
from the bottoms (c_prev is kept in c_prev_ only when a top overwrites it in place).
"""
from caffe.layers import _cpu
from caffe.layers.layer import Layer
from caffe.layers.registry import register_layer


def _sigmoid(xp, x):
    return 0.5 * xp.tanh(0.5 * x) + 0.5  # overflow-free


@register_layer("LSTMUnit")
class LSTMUnitLayer(Layer):
    exact_num_bottom_blobs = 3
    exact_num_top_blobs = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2  # no gradient to the sequence continuation indicators

    def reshape(self, bottom, top):
        c_prev, x, cont = bottom
        n = c_prev.shape[1] if c_prev.num_axes >= 2 else -1
        names = ("c_prev", "x (gates)", "cont")
        for i, b in enumerate(bottom):
            axes = 2 if i == 2 else 3
            if not (b.num_axes == axes and b.shape[0] == 1 and b.shape[1] == n):
                raise self.error(f"bottom[{i}] ({names[i]}) must have shape (1, N{', ...' if axes == 3 else ''}) with "
                                 f"{axes} axes and N = {n} from bottom[0]; shapes: c_prev {c_prev.shape}, x {x.shape}, "
                                 f"cont {cont.shape}")
        self.D = c_prev.shape[2]
        if x.shape[2] != 4 * self.D:
            raise self.error(f"bottom[1] (x) must have 4 * D = {4 * self.D} gate inputs per "
                             f"item; shapes: c_prev {c_prev.shape}, x {x.shape}")
        top[0].reshape_like(c_prev)
        top[1].reshape_like(c_prev)

    def forward_xp(self, xp, bottom, top):
        D = self.D
        c_prev = bottom[0].data_xp(xp)[0]
        x = bottom[1].data_xp(xp)[0]
        cont = bottom[2].data_xp(xp)[0][:, None]
        i = _sigmoid(xp, x[:, :D])
        sf = _sigmoid(xp, x[:, D:2 * D])
        o = _sigmoid(xp, x[:, 2 * D:3 * D])
        g = xp.tanh(x[:, 3 * D:])
        c = cont * sf * c_prev + i * g
        tanh_c = xp.tanh(c)
        acts = _cpu.state_blob(self, "X_acts_", (1, c.shape[0], 5 * D), c.dtype).mutable_data_xp(xp)[0]
        for k, a in enumerate((i, sf, o, g, tanh_c)):
            acts[:, k * D:(k + 1) * D] = a
        if bottom[0] is top[0] or bottom[0] is top[1]:
            _cpu.state_blob(self, "c_prev_", bottom[0]).mutable_data_xp(xp)[...] = bottom[0].data_xp(xp)
        top[0].mutable_data_xp(xp)[0] = c
        top[1].mutable_data_xp(xp)[0] = o * tanh_c

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("Cannot backpropagate to sequence indicators (bottom[2], cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        D = self.D
        acts = getattr(self, "X_acts_", None)
        if acts is None or acts.shape != (1, top[0].shape[1], 5 * D):
            raise self.error("backward needs a forward pass first (no saved gate activations)")
        i, sf, o, g, tanh_c = (acts.data_xp(xp)[0][:, k * D:(k + 1) * D] for k in range(5))
        in_place = bottom[0] is top[0] or bottom[0] is top[1]
        c_prev = (self.c_prev_ if in_place else bottom[0]).data_xp(xp)[0]
        cont = bottom[2].data_xp(xp)[0][:, None]
        dc = top[0].diff_xp(xp)[0]
        dh = top[1].diff_xp(xp)[0]
        c_term = dc + dh * o * (1 - tanh_c * tanh_c)
        # the gate diffs first: in place, bottom[0]'s diff is a top's diff (dh or dc), read here
        if propagate_down[1]:
            dx = xp.concatenate([c_term * g * i * (1 - i),
                                 c_term * c_prev * cont * sf * (1 - sf),
                                 dh * tanh_c * o * (1 - o),
                                 c_term * i * (1 - g * g)], axis=1)
            bottom[1].mutable_diff_xp(xp)[0] = dx
        if propagate_down[0]:
            bottom[0].mutable_diff_xp(xp)[0] = c_term * cont * sf
