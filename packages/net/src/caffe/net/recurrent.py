"""RNN and LSTM layers: an unrolled internal Net, built as Caffe builds it (recurrent_layer.cpp,
rnn_layer.cpp, lstm_layer.cpp).

Bottoms: x (T, N, ...), cont (T, N) sequence-continuation flags (0 starts a new sequence), an optional
static input x_static (N, ...), and with recurrent_param.expose_hidden the initial states (RNN: h0;
LSTM: h0, c0, each (1, N, num_output)). Tops: the outputs (T, N, num_output) (RNN: o; LSTM: h) and with
expose_hidden the final states (RNN: hT; LSTM: hT, cT).

The unrolled net has the same layers, blob names, parameter names and parameter order as Caffe's
(RNN: W_xh, b_h, [W_xh_static], W_hh, W_ho, b_o; LSTM: W_xc, b_c, [W_xc_static], W_hc), so caffemodels
load. Layer names are prefixed with this layer's name. Reduction "pseudo-losses" on the outputs make the
net backpropagate; they are never run. Without expose_hidden the final state of one forward is the
initial state of the next (cont = 0 resets it). As in Caffe, no gradient flows to cont, to the exposed
initial states (their data is shared, not their diff) or from the exposed final states.
"""
from __future__ import annotations

import numpy as np

from caffe.layers.layer import Layer, LayerError
from caffe.layers.registry import register_layer
from caffe.proto import caffe_pb2


def _layer(net_param, type_name, name, bottoms=(), tops=(), params=(), propagate_down=()):
    lp = net_param.layer.add()
    lp.type, lp.name = type_name, name
    lp.bottom.extend(bottoms)
    lp.top.extend(tops)
    for p in params:
        lp.param.add(name=p)
    lp.propagate_down.extend(propagate_down)
    return lp


def _inner_product(lp, num_output, axis, weight_filler, bias_filler=None):
    ip = lp.inner_product_param
    ip.num_output, ip.axis = num_output, axis
    ip.bias_term = bias_filler is not None
    ip.weight_filler.CopyFrom(weight_filler)
    if bias_filler is not None:
        ip.bias_filler.CopyFrom(bias_filler)
    return lp


class RecurrentLayer(Layer):
    """The machinery shared by RNN and LSTM (Caffe's RecurrentLayer)."""

    recur_input_names: tuple = ()

    def __init__(self, layer_param):
        super().__init__(layer_param)
        n_exposed = len(self.recur_input_names) if self.layer_param.recurrent_param.expose_hidden else 0
        self.min_bottom_blobs = 2 + n_exposed
        self.max_bottom_blobs = 3 + n_exposed
        self.exact_num_top_blobs = 1 + n_exposed

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1  # no gradient to the sequence continuation indicators

    # -- what subclasses define --------------------------------------------------------------------------
    def recur_output_names(self) -> list[str]:
        raise NotImplementedError

    def output_names(self) -> list[str]:
        raise NotImplementedError

    def fill_unrolled_net(self, net_param) -> None:
        raise NotImplementedError

    def recur_input_shapes(self) -> list[list[int]]:
        return [[1, self.N, self.num_output] for _ in self.recur_input_names]

    # -- setup ----------------------------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        from caffe.net.net import Net  # imported here: caffe.net imports this module
        rp = self.layer_param.recurrent_param
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes -- (#timesteps, #streams, ...); "
                             f"got shape {x.shape}")
        self.T, self.N = x.shape[0], x.shape[1]
        if not (cont.num_axes == 2 and cont.shape == (self.T, self.N)):
            raise self.error(f"bottom[1] (cont) must have exactly 2 axes -- (#timesteps, #streams) = "
                             f"({self.T}, {self.N}); got shape {cont.shape} (x has shape {x.shape})")
        self.num_output = rp.num_output
        self.check(self.num_output > 0, "recurrent_param.num_output must be positive")
        self.expose_hidden = rp.expose_hidden
        n_exposed = len(self.recur_input_names) if self.expose_hidden else 0
        self.static_input = len(bottom) > 2 + n_exposed
        if self.static_input:
            xs = bottom[2]
            if not (xs.num_axes >= 1 and xs.shape[0] == self.N):
                raise self.error(f"bottom[2] (x_static) must have shape (N = {self.N}, ...); got {xs.shape}")

        net_param = caffe_pb2.NetParameter()
        net_param.state.phase = self.phase
        inputs = _layer(net_param, "Input", "", tops=["x", "cont"] + (["x_static"] if self.static_input else []))
        for b in bottom[:3 if self.static_input else 2]:
            inputs.input_param.shape.add(dim=list(b.shape))
        self.fill_unrolled_net(net_param)
        if self.name:  # prefix this layer's name, as Caffe does
            for lp in net_param.layer:
                lp.name = f"{self.name}_{lp.name}"
        pseudo_losses = []
        for name in self.output_names():
            lp = _layer(net_param, "Reduction", f"{name}_pseudoloss", bottoms=[name], tops=[f"{name}_pseudoloss"])
            lp.loss_weight.append(1.0)
            pseudo_losses.append(lp.name)
        try:
            self.unrolled_net = Net(net_param, dtype=x.dtype)
        except LayerError as exc:
            raise self.error(f"cannot build the unrolled net: {exc}") from exc
        net = self.unrolled_net
        net.set_debug_info(rp.debug_info)
        self.x_input = net.blob_by_name("x")
        self.cont_input = net.blob_by_name("cont")
        self.x_static_input = net.blob_by_name("x_static") if self.static_input else None
        self.recur_inputs = [net.blob_by_name(n) for n in self.recur_input_names]
        self.recur_outputs = [net.blob_by_name(n) for n in self.recur_output_names()]
        self.outputs = [net.blob_by_name(n) for n in self.output_names()]
        n_inputs = 2 + len(self.recur_inputs) + self.static_input
        if len(net.input_blobs) != n_inputs:
            raise self.error(f"the unrolled net has {len(net.input_blobs)} inputs, expected {n_inputs}")

        # This layer's parameters: each parameter of the unrolled net once (its owner's blob).
        loaded = list(self.blobs)
        self.blobs = [p for p, owner in zip(net._params, net.param_owners) if owner == -1]
        if loaded:  # blobs carried by the layer_param (a saved layer): load them into the unrolled net
            if not (len(loaded) == len(self.blobs) and all(a.shape == b.shape for a, b in zip(loaded, self.blobs))):
                raise self.error(f"stored blobs have shapes {[b.shape for b in loaded]}, the unrolled net needs "
                                 f"{[b.shape for b in self.blobs]}")
            for src, dst in zip(loaded, self.blobs):
                dst.mutable_cpu_data()[...] = src.cpu_data()
        for i in range(len(self.blobs)):
            self.set_param_propagate_down(i, True)
        # Each unrolled layer learns (the net decides by lr_mult): make sure every blob gets its gradient.
        for lyr in net.layers:
            for j in range(len(lyr.blobs)):
                lyr.set_param_propagate_down(j, True)
        # No state from a previous batch at the start; no gradient across batches.
        for b in self.recur_outputs:
            b.mutable_cpu_data()[...] = 0
            b.mutable_cpu_diff()[...] = 0
        self.last_layer_index = len(net.layers) - 1 - len(pseudo_losses)
        self.check(net.layer_names[self.last_layer_index + 1:] == pseudo_losses,
                   "the unrolled net must end with the pseudo-loss layers")

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes -- (#timesteps, #streams, ...); "
                             f"got shape {x.shape}")
        if x.shape[0] != self.T:
            raise self.error(f"input number of timesteps changed: bottom[0] has shape {x.shape}, "
                             f"the layer was set up for T = {self.T}")
        self.N = x.shape[1]
        if not (cont.num_axes == 2 and cont.shape == (self.T, self.N)):
            raise self.error(f"bottom[1] (cont) must have shape (T, N) = ({self.T}, {self.N}); got {cont.shape}")
        self.x_input.reshape_like(x)
        self.cont_input.reshape_like(cont)
        if self.static_input:
            self.x_static_input.reshape_like(bottom[2])
        for blob, shape in zip(self.recur_inputs, self.recur_input_shapes()):
            blob.reshape(shape)
        self.unrolled_net.Reshape()
        self.x_input.share_data(x)
        self.x_input.share_diff(x)
        self.cont_input.share_data(cont)
        if self.static_input:
            self.x_static_input.share_data(bottom[2])
            self.x_static_input.share_diff(bottom[2])
        if self.expose_hidden:
            offset = 2 + self.static_input
            for j, blob in enumerate(self.recur_inputs):
                b = bottom[offset + j]
                if b.shape != blob.shape:
                    raise self.error(f"bottom[{offset + j}] ({self.recur_input_names[j]}) must have the hidden state "
                                     f"shape {blob.shape}; got {b.shape}")
                blob.share_data(b)
        for t, out in zip(top, self.outputs):
            t.reshape_like(out)
            t.share_data(out)
            t.share_diff(out)
        if self.expose_hidden:
            for t, rec in zip(top[len(self.outputs):], self.recur_outputs):
                t.reshape_like(rec)

    def reset(self) -> None:
        """Forget the hidden state carried between batches (Caffe's Reset)."""
        for b in self.recur_outputs:
            b.mutable_cpu_data()[...] = 0

    Reset = reset

    # -- forward / backward ---------------------------------------------------------------------------------
    def _run_forward(self, xp, bottom, top):
        if self.phase == caffe_pb2.TEST:  # re-share weights a solver may have re-pointed (Caffe does the same)
            self.unrolled_net.ShareWeights()
        if not self.expose_hidden:
            for src, dst in zip(self.recur_outputs, self.recur_inputs):
                dst.mutable_data_xp(xp)[...] = src.data_xp(xp)
        self.unrolled_net.ForwardTo(self.last_layer_index)
        if self.expose_hidden:
            for t, rec in zip(top[len(self.outputs):], self.recur_outputs):
                t.share_data(rec)

    def forward_cpu(self, bottom, top):
        self._run_forward(np, bottom, top)

    def forward_gpu(self, bottom, top):
        import cupy
        self._run_forward(cupy, bottom, top)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("Cannot backpropagate to sequence indicators (bottom[1], cont)")
        # The inputs or the parameters need a gradient (or the net would not call us): run it all.
        self.unrolled_net.BackwardFrom(self.last_layer_index)

    backward_gpu = backward_cpu


@register_layer("RNN")
class RNNLayer(RecurrentLayer):
    """h_t = tanh(W_hh (cont_t * h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static]);
    o_t = tanh(W_ho h_t + b_o)."""

    recur_input_names = ("h_0",)

    def recur_output_names(self):
        return [f"h_{self.T}"]

    def output_names(self):
        return ["o"]

    def fill_unrolled_net(self, net_param):
        rp = self.layer_param.recurrent_param
        H, wf, bf = self.num_output, rp.weight_filler, rp.bias_filler
        inp = _layer(net_param, "Input", "", tops=["h_0"])
        inp.input_param.shape.add(dim=self.recur_input_shapes()[0])
        cont_slice = _layer(net_param, "Slice", "cont_slice", bottoms=["cont"])
        cont_slice.slice_param.axis = 0
        _inner_product(_layer(net_param, "InnerProduct", "x_transform", ["x"], ["W_xh_x"], ["W_xh", "b_h"], [True]),
                       H, 2, wf, bf)
        if self.static_input:
            _inner_product(_layer(net_param, "InnerProduct", "W_xh_x_static", ["x_static"],
                                  ["W_xh_x_static_preshape"], ["W_xh_static"], [True]), H, 1, wf)
            rs = _layer(net_param, "Reshape", "W_xh_x_static_reshape", ["W_xh_x_static_preshape"], ["W_xh_x_static"])
            rs.reshape_param.shape.dim.extend([1, -1, H])
        x_slice = _layer(net_param, "Slice", "W_xh_x_slice", bottoms=["W_xh_x"])
        x_slice.slice_param.axis = 0
        concat = []
        for t in range(1, self.T + 1):
            p, c = t - 1, t
            cont_slice.top.append(f"cont_{c}")
            x_slice.top.append(f"W_xh_x_{c}")
            sc = _layer(net_param, "Scale", f"h_conted_{p}", [f"h_{p}", f"cont_{c}"], [f"h_conted_{p}"])
            sc.scale_param.axis = 0
            _inner_product(_layer(net_param, "InnerProduct", f"W_hh_h_{p}", [f"h_conted_{p}"], [f"W_hh_h_{p}"],
                                  ["W_hh"]), H, 2, wf)
            _layer(net_param, "Eltwise", f"h_input_sum_{c}",
                   [f"W_hh_h_{p}", f"W_xh_x_{c}"] + (["W_xh_x_static"] if self.static_input else []),
                   [f"h_neuron_input_{c}"]).eltwise_param.operation = 1  # SUM
            _layer(net_param, "TanH", f"h_neuron_{c}", [f"h_neuron_input_{c}"], [f"h_{c}"])
            _inner_product(_layer(net_param, "InnerProduct", f"W_ho_h_{c}", [f"h_{c}"], [f"W_ho_h_{c}"],
                                  ["W_ho", "b_o"]), H, 2, wf, bf)
            _layer(net_param, "TanH", f"o_neuron_{c}", [f"W_ho_h_{c}"], [f"o_{c}"])
            concat.append(f"o_{c}")
        _layer(net_param, "Concat", "o_concat", concat, ["o"]).concat_param.axis = 0


@register_layer("LSTM")
class LSTMLayer(RecurrentLayer):
    """Gates from W_hc (cont_t * h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static], in Caffe's order
    i, f, o, g; c_t = cont_t * f_t * c_{t-1} + i_t * g_t; h_t = o_t * tanh(c_t) (LSTMUnit)."""

    recur_input_names = ("h_0", "c_0")

    def recur_output_names(self):
        return [f"h_{self.T}", "c_T"]

    def output_names(self):
        return ["h"]

    def fill_unrolled_net(self, net_param):
        rp = self.layer_param.recurrent_param
        H, wf, bf = self.num_output, rp.weight_filler, rp.bias_filler
        inp = _layer(net_param, "Input", "", tops=["c_0", "h_0"])
        for shape in self.recur_input_shapes():
            inp.input_param.shape.add(dim=shape)
        cont_slice = _layer(net_param, "Slice", "cont_slice", bottoms=["cont"])
        cont_slice.slice_param.axis = 0
        _inner_product(_layer(net_param, "InnerProduct", "x_transform", ["x"], ["W_xc_x"], ["W_xc", "b_c"], [True]),
                       4 * H, 2, wf, bf)
        if self.static_input:
            _inner_product(_layer(net_param, "InnerProduct", "W_xc_x_static", ["x_static"],
                                  ["W_xc_x_static_preshape"], ["W_xc_static"], [True]), 4 * H, 1, wf)
            rs = _layer(net_param, "Reshape", "W_xc_x_static_reshape", ["W_xc_x_static_preshape"], ["W_xc_x_static"])
            rs.reshape_param.shape.dim.extend([1, -1, 4 * H])
        x_slice = _layer(net_param, "Slice", "W_xc_x_slice", bottoms=["W_xc_x"])
        x_slice.slice_param.axis = 0
        concat = []
        for t in range(1, self.T + 1):
            p, c = t - 1, t
            cont_slice.top.append(f"cont_{c}")
            x_slice.top.append(f"W_xc_x_{c}")
            sc = _layer(net_param, "Scale", f"h_conted_{p}", [f"h_{p}", f"cont_{c}"], [f"h_conted_{p}"])
            sc.scale_param.axis = 0
            _inner_product(_layer(net_param, "InnerProduct", f"transform_{c}", [f"h_conted_{p}"], [f"W_hc_h_{p}"],
                                  ["W_hc"]), 4 * H, 2, wf)
            _layer(net_param, "Eltwise", f"gate_input_{c}",
                   [f"W_hc_h_{p}", f"W_xc_x_{c}"] + (["W_xc_x_static"] if self.static_input else []),
                   [f"gate_input_{c}"]).eltwise_param.operation = 1  # SUM
            _layer(net_param, "LSTMUnit", f"unit_{c}", [f"c_{p}", f"gate_input_{c}", f"cont_{c}"],
                   [f"c_{c}", f"h_{c}"])
            concat.append(f"h_{c}")
        _layer(net_param, "Split", "", [f"c_{self.T}"], ["c_T"])
        _layer(net_param, "Concat", "h_concat", concat, ["h"]).concat_param.axis = 0
