"""caffe.solver: Caffe's solvers over caffe.net.Net.

`Solver(path_or_param)` builds the solver its `type` names; the typed classes
(`SGDSolver`, `NesterovSolver`, `AdaGradSolver`, `RMSPropSolver`, `AdaDeltaSolver`,
`AdamSolver`) build their own type whatever the file says, as pycaffe's do;
`get_solver(path)` is pycaffe's caffe.get_solver. Snapshots and solver states are
file-compatible with BVLC Caffe (binary proto and HDF5).
"""
from caffe.solver.params import SolverError, read_solver_params, upgrade_solver_as_needed
from caffe.solver.registry import (register_solver, solver_type_list, solver_class, create_solver, get_solver,
                                   UnknownSolverTypeError)
from caffe.solver.signals import SolverAction, SignalHandler, action_from_string
from caffe.solver.solver import Solver, NonFiniteLossError
from caffe.solver.sgd_solver import SGDSolver
from caffe.solver.nesterov_solver import NesterovSolver
from caffe.solver.adagrad_solver import AdaGradSolver
from caffe.solver.rmsprop_solver import RMSPropSolver
from caffe.solver.adadelta_solver import AdaDeltaSolver
from caffe.solver.adam_solver import AdamSolver

__all__ = ["Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver",
           "AdamSolver", "get_solver", "create_solver", "register_solver", "solver_type_list", "solver_class",
           "SolverError", "UnknownSolverTypeError", "NonFiniteLossError", "SolverAction", "SignalHandler",
           "action_from_string", "read_solver_params", "upgrade_solver_as_needed"]
