"""The layer registry: type name -> Layer class (Caffe's REGISTER_LAYER_CLASS)."""
from __future__ import annotations

import difflib

_REGISTRY: dict[str, type] = {}


class UnknownLayerTypeError(ValueError):
    pass


def register_layer(type_name: str):
    """Class decorator: register `cls` under `type_name` and set `cls.type`."""
    def deco(cls):
        if type_name in _REGISTRY and _REGISTRY[type_name] is not cls:
            raise ValueError(f"Layer type {type_name!r} already registered ({_REGISTRY[type_name].__qualname__})")
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls
    return deco


def layer_class(type_name: str) -> type:
    try:
        return _REGISTRY[type_name]
    except KeyError:
        close = difflib.get_close_matches(type_name, _REGISTRY, n=3, cutoff=0.5)
        if not close:
            low = type_name.lower()
            close = [k for k in _REGISTRY if k.lower() == low]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownLayerTypeError(
            f"Unknown layer type: {type_name!r}.{hint} (known types: {', '.join(layer_type_list())})") from None


def create_layer(layer_param):
    """Instantiate the layer described by a LayerParameter."""
    return layer_class(layer_param.type)(layer_param)


def layer_type_list() -> list[str]:
    return sorted(_REGISTRY)
