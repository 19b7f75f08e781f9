"""Helpers for solver tests: small least-squares nets fed batch by batch from NumPy arrays.

    net_text = least_squares_net(num=4, dim=3)             # Input -> InnerProduct -> EuclideanLoss
    param = solver_param(net_text, type="Adam", base_lr=0.01, lr_policy="fixed")
    solver = caffe.solver.Solver(param)
    Feeder(batches).attach(solver.net)                      # one batch per ForwardBackward

The closed-form reference updates belong to the tests themselves (they must stay independent
of the code under test); only the plumbing lives here.
"""
from __future__ import annotations

import numpy as np
from google.protobuf import text_format

from caffe.proto import caffe_pb2


def least_squares_net(num: int, dim: int, share: bool = False, lr_mult=(1.0, 1.0), decay_mult=(1.0, 1.0),
                      filler_std: float = 1.0, name: str = "least_squares") -> str:
    """Input(data [num, dim], targets [num, 1]) -> InnerProduct(1) -> EuclideanLoss.

    share=True adds a second input `data2` through a second InnerProduct sharing the first one's
    weight and bias (param names 'w', 'b') into a second EuclideanLoss, so the shared blobs collect
    the gradients of both branches.
    """
    shapes = f"shape {{ dim: {num} dim: {dim} }} "
    tops = 'top: "data" '
    if share:
        tops += 'top: "data2" '
        shapes += f"shape {{ dim: {num} dim: {dim} }} "
    tops += 'top: "targets" '
    shapes += f"shape {{ dim: {num} dim: 1 }} "

    def ip(layer, bottom, top):
        names = ('name: "w" ', 'name: "b" ') if share else ("", "")
        return (f'layer {{ name: "{layer}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" '
                f'param {{ {names[0]}lr_mult: {lr_mult[0]} decay_mult: {decay_mult[0]} }} '
                f'param {{ {names[1]}lr_mult: {lr_mult[1]} decay_mult: {decay_mult[1]} }} '
                f'inner_product_param {{ num_output: 1 '
                f'weight_filler {{ type: "gaussian" std: {filler_std} }} '
                f'bias_filler {{ type: "gaussian" std: {filler_std} }} }} }}\n')

    text = f'name: "{name}"\nlayer {{ name: "input" type: "Input" {tops}input_param {{ {shapes}}} }}\n'
    text += ip("ip", "data", "ip")
    text += 'layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "targets" top: "loss" }\n'
    if share:
        text += ip("ip2", "data2", "ip2")
        text += 'layer { name: "loss2" type: "EuclideanLoss" bottom: "ip2" bottom: "targets" top: "loss2" }\n'
    return text


def net_param(text: str):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def solver_param(net_text: str | None = None, **fields):
    """A SolverParameter with `net_param` parsed from `net_text` and scalar/repeated fields set."""
    p = caffe_pb2.SolverParameter()
    if net_text is not None:
        p.net_param.CopyFrom(net_param(net_text))
    for key, value in fields.items():
        if isinstance(value, (list, tuple)):
            getattr(p, key).extend(value)
        else:
            setattr(p, key, value)
    return p


class Feeder:
    """Writes batch k of `batches` (dicts blob name -> array) into a net's input blobs before each forward
    pass that starts at layer 0; `start` is the index of the next batch (batches repeat cyclically)."""

    def __init__(self, batches, start: int = 0):
        self.batches = list(batches)
        self.count = start

    def __call__(self, layer_index: int) -> None:
        if layer_index == 0:
            self.feed(self.net)

    def feed(self, net) -> None:
        batch = self.batches[self.count % len(self.batches)]
        for name, array in batch.items():
            net.blobs[name].data[...] = array
        self.count += 1

    def attach(self, net) -> "Feeder":
        self.net = net
        net.before_forward(self)
        return self


def random_batches(seed: int, n: int, num: int, dim: int, share: bool = False, dtype=np.float32):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = {"data": rng.standard_normal((num, dim)).astype(dtype),
             "targets": rng.standard_normal((num, 1)).astype(dtype)}
        if share:
            b["data2"] = rng.standard_normal((num, dim)).astype(dtype)
        out.append(b)
    return out
