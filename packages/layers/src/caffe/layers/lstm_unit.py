"""LSTMUnit: one LSTM time step on precomputed gate inputs (Caffe's lstm_unit_layer).

bottoms: c_prev (1, N, D), x (1, N, 4D) the gate pre-activations in Caffe's order i, f, o, g, and
cont (1, N) the sequence-continuation flags; tops: c (1, N, D) and h (1, N, D):
  i = sigmoid(x_i)  f = cont * sigmoid(x_f)  o = sigmoid(x_o)  g = tanh(x_g)
  c = f * c_prev + i * g       h = o * tanh(c)
cont = 0 starts a new sequence (c_prev is masked out). No gradient flows to cont.
Backward is the exact gradient (Caffe's GPU form; its CPU form agrees for cont in {0, 1}).
"""
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
        self._acts = (i, sf, o, g, tanh_c, cont, c_prev.copy())
        top[0].mutable_data_xp(xp)[0] = c
        top[1].mutable_data_xp(xp)[0] = o * tanh_c

    def backward_xp(self, xp, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("Cannot backpropagate to sequence indicators (bottom[2], cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        i, sf, o, g, tanh_c, cont, c_prev = self._acts
        dc = top[0].diff_xp(xp)[0]
        dh = top[1].diff_xp(xp)[0]
        c_term = dc + dh * o * (1 - tanh_c * tanh_c)
        if propagate_down[0]:
            bottom[0].mutable_diff_xp(xp)[0] = c_term * cont * sf
        if propagate_down[1]:
            dx = xp.concatenate([c_term * g * i * (1 - i),
                                 c_term * c_prev * cont * sf * (1 - sf),
                                 dh * tanh_c * o * (1 - o),
                                 c_term * i * (1 - g * g)], axis=1)
            bottom[1].mutable_diff_xp(xp)[0] = dx
