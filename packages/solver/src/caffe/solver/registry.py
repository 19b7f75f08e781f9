"""The solver registry (Caffe's SolverRegistry): type name -> solver class."""
from __future__ import annotations

from caffe.solver.params import SolverError

_REGISTRY: dict[str, type] = {}


class UnknownSolverTypeError(SolverError):
    pass


def register_solver(name: str):
    """Class decorator: register a Solver subclass under `name` (the SolverParameter `type`)."""
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise SolverError(f"Solver type {name} already registered.")
        _REGISTRY[name] = cls
        return cls
    return deco


def solver_type_list() -> list[str]:
    return sorted(_REGISTRY)


def solver_class(name: str):
    cls = _REGISTRY.get(name)
    if cls is None:
        raise UnknownSolverTypeError(f"Unknown solver type: {name!r} (known types: {', '.join(solver_type_list())})")
    return cls


def create_solver(param):
    """SolverRegistry::CreateSolver: the solver its `type` names, built from a SolverParameter."""
    from caffe.solver.solver import _load_param
    param = _load_param(param)
    return solver_class(param.type)(param)


def get_solver(path_or_param):
    """pycaffe's caffe.get_solver(filename): read the solver prototxt and build the solver of its type."""
    from caffe.solver.solver import _load_param
    param = _load_param(path_or_param)
    cls = solver_class(param.type)
    obj = cls.__new__(cls)
    obj._preloaded_param = param
    obj.__init__(path_or_param)
    return obj
