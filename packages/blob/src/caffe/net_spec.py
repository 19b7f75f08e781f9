"""pycaffe's net specification: write nets in Python, get a NetParameter.

    from caffe import layers as L, params as P
    n = caffe.NetSpec()
    n.data, n.label = L.Data(source='train_lmdb', backend=P.Data.LMDB, batch_size=64, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    print(n.to_proto())

`L.<Type>(*bottoms, **params)` makes a layer of any type name and returns its Top (or a tuple of
Tops for `ntop=N`, or the layer itself for `ntop=0`). Keyword parameters go into the layer's own
parameter message (`convolution_param` for Convolution, ...) when it has the field, else into
LayerParameter itself (`param`, `include`, `loss_weight`, ...); keys ending in `param` always go to
LayerParameter. Dicts become messages, lists become repeated fields, and a single value given for a
repeated field becomes a one-element list. `P.<Type>.<ENUM>` is the enum value of `<Type>Parameter`.

Names are pycaffe's, so generated prototxts match pycaffe's: a top assigned to `n.name` is called
`name` and so is the layer that produces it (its first top's name); other tops and top-less layers
are named `<Type><k>`, k counting per type name over the whole generation, in the order pycaffe
visits them (NetSpec attributes in assignment order, each layer's bottoms first). An in-place layer
(`in_place=True`) writes its bottoms as its tops.

Needs only caffe_pb2, so it lives in caffe-blob, beside caffe/__init__.py; `caffe.layers` (the
layer-implementation package) answers `L.<Type>` with these builders too.
"""
from __future__ import annotations

from collections import Counter, OrderedDict

from caffe.proto import caffe_pb2

__all__ = ["NetSpec", "Top", "Function", "Layers", "Parameters", "to_proto", "assign_proto",
           "param_name_dict", "layers", "params"]


def param_name_dict() -> dict[str, str]:
    """Layer type name -> the prefix of its parameter field, from LayerParameter's `*_param` fields:
    'Convolution' -> 'convolution' (convolution_param: ConvolutionParameter), as pycaffe derives it."""
    out = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[:-len("Parameter")]] = field.name[:-len("_param")]
    return out


_param_names = param_name_dict()

# Layer types whose parameters live in another type's message (pycaffe has no entry for them, so
# `L.Deconvolution(x, num_output=...)` failed there); loss layers also read loss_param.
_LOSS_TYPES = ("SoftmaxWithLoss", "SigmoidCrossEntropyLoss", "EuclideanLoss", "HingeLoss", "InfogainLoss",
               "ContrastiveLoss", "MultinomialLogisticLoss")
_SHARED_PARAMS = {"Deconvolution": ["convolution"], "Im2col": ["convolution"], "SoftmaxWithLoss": ["softmax"],
                  "RNN": ["recurrent"], "LSTM": ["recurrent"]}


def _param_fields(type_name: str) -> list[str]:
    """The parameter fields (of LayerParameter) that a layer type's keyword parameters may fill."""
    fields = [_param_names[type_name] + "_param"] if type_name in _param_names else []
    fields += [p + "_param" for p in _SHARED_PARAMS.get(type_name, [])]
    if type_name in _LOSS_TYPES:
        fields.append("loss_param")
    return fields


def _has_field(message, name: str) -> bool:
    return name in message.DESCRIPTOR.fields_by_name


def _is_repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6 (FieldDescriptor.label is gone in 7)
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def assign_proto(proto, name: str, val) -> None:
    """Set field `name` of message `proto` from a Python value: dicts fill sub-messages, lists (or
    tuples) fill repeated fields (dicts in them add messages), a scalar given for a repeated field
    becomes a one-element list, other values are assigned."""
    field = proto.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise AttributeError(f"{proto.DESCRIPTOR.name} has no field '{name}'")
    repeated = _is_repeated(field)
    if repeated and not isinstance(val, (list, tuple)):
        val = [val]
    if isinstance(val, (list, tuple)):
        if not repeated:
            raise TypeError(f"{proto.DESCRIPTOR.name}.{name} is not a repeated field; got a list {list(val)!r}")
        target = getattr(proto, name)
        if field.message_type is not None:
            for item in val:
                if not isinstance(item, dict):
                    raise TypeError(f"{proto.DESCRIPTOR.name}.{name} holds {field.message_type.name} messages: "
                                    f"give each as a dict, got {item!r}")
                sub = target.add()
                for k, v in item.items():
                    assign_proto(sub, k, v)
        else:
            target.extend(val)
    elif isinstance(val, dict):
        if field.message_type is None:
            raise TypeError(f"{proto.DESCRIPTOR.name}.{name} is not a message; got a dict {val!r}")
        sub = getattr(proto, name)
        for k, v in val.items():
            assign_proto(sub, k, v)
    else:
        setattr(proto, name, val)


class Top:
    """One output blob of a layer (output n of Function fn)."""

    def __init__(self, fn: "Function", n: int):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer needed to compute this top (names generated)."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)

    def __repr__(self):
        return f"<Top {self.n} of {self.fn.type_name}>"


class Function:
    """A layer: its type name, its input Tops and its parameters (`ntop` and `in_place` taken out)."""

    def __init__(self, type_name: str, inputs, params: dict):
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(inp)})")
        self.inputs = tuple(inputs)
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        if not isinstance(self.ntop, int) or self.ntop < 0:
            raise ValueError(f"{type_name}: ntop must be a non-negative integer, got {self.ntop!r}")
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames) -> str:
        # a layer takes its first top's name; a top-less layer is named <Type><k> unless assigned
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top: Top, names, autonames) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames) -> None:
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for key, value in self.params.items():
            self._assign(layer, key, value)
        layers[self] = layer

    def _assign(self, layer, key: str, value) -> None:
        """A keyword parameter into the layer's own parameter message, or else LayerParameter."""
        target = None
        if not key.endswith("param"):
            for field in _param_fields(self.type_name):
                if _has_field(getattr(layer, field), key):
                    target = getattr(layer, field)
                    break
        if target is None:
            if not _has_field(layer, key):
                where = " or ".join(_param_fields(self.type_name) + ["LayerParameter"])
                raise AttributeError(f"{self.type_name} layer '{layer.name}': unknown parameter '{key}' "
                                     f"(no such field in {where})")
            target = layer
        try:
            assign_proto(target, key, value)
        except (AttributeError, TypeError, ValueError) as exc:
            raise type(exc)(f"{self.type_name} layer '{layer.name}', parameter '{key}': {exc}") from None


def to_proto(*tops):
    """A NetParameter with every layer needed to compute `tops`, all names generated."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        top._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class NetSpec:
    """Tops assigned as attributes (or items) by name; to_proto() builds every layer they need, naming
    the assigned tops (and their layers) by the names they were assigned."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy, pickle and friends probe for these
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top named '{name}' (assigned: {', '.join(self.tops) or 'none'})") \
                from None

    def __delattr__(self, name):
        del self.tops[name]

    def __setitem__(self, key, value):
        self.tops[key] = value

    def __getitem__(self, item):
        return self.tops[item]

    def __delitem__(self, key):
        del self.tops[key]

    def __contains__(self, name):
        return name in self.tops

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """`L.<Type>(*bottoms, **params)`: a layer builder for any type name."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _layer_builder(name)


def _layer_builder(type_name: str):
    def layer_fn(*args, **kwargs):
        fn = Function(type_name, args, kwargs)
        if fn.ntop == 0:
            return fn
        if fn.ntop == 1:
            return fn.tops[0]
        return fn.tops
    layer_fn.__name__ = layer_fn.__qualname__ = type_name
    layer_fn.__doc__ = f"A {type_name} layer: {type_name}(*bottoms, ntop=1, in_place=False, **params) -> Top(s)"
    return layer_fn


class _EnumValues:
    def __init__(self, type_name: str):
        self._type_name = type_name

    def __getattr__(self, value_name):
        if value_name.startswith("__") and value_name.endswith("__"):
            raise AttributeError(value_name)
        message = getattr(caffe_pb2, self._type_name + "Parameter", None)
        if message is None:
            raise AttributeError(f"caffe.params.{self._type_name}: caffe.proto has no message "
                                 f"{self._type_name}Parameter")
        try:
            return getattr(message, value_name)
        except AttributeError:
            raise AttributeError(f"caffe.params.{self._type_name}.{value_name}: {self._type_name}Parameter "
                                 f"has no enum value {value_name}") from None


class Parameters:
    """`P.<Type>.<VALUE>`: the enum value VALUE of <Type>Parameter, e.g. P.Pooling.MAX."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _EnumValues(name)


layers = Layers()
params = Parameters()
