"""A/B in one process: a solver's ApplyUpdate (L2 decay 0.0005, momentum 0.9 where it takes one) fused (kernels.update: one pass
per parameter) and by the array passes (Regularize, ComputeUpdateValue, Net.Update), interleaved, on
bench_nets' training nets, for any of the six solvers (--solvers). Also a whole solver step (clear diffs, forward,
backward, update) each way. Run from the repo root:

    python bench/ab_sgd_update.py [--rounds 5] [--nets lenet,caffenet] [--solvers SGD,Nesterov,Adam]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_nets  # noqa: E402  (sets GLOG_minloglevel before caffe logs)
from caffe.proto import caffe_pb2  # noqa: E402
from caffe.solver import get_solver, sgd_solver  # noqa: E402

SHAPES = {"lenet": ((64, 1, 28, 28), (64,), 50), "caffenet": ((8, 3, 227, 227), (8,), 5),
          "cifar10_quick": ((100, 3, 32, 32), (100,), 20)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nets", default="lenet,caffenet")
    ap.add_argument("--solvers", default="SGD")
    args = ap.parse_args()
    kernel = sgd_solver._update
    for name, solver_type in [(n, t) for n in args.nets.split(",") for t in args.solvers.split(",")]:
        dshape, lshape, n = SHAPES[name]
        sp = caffe_pb2.SolverParameter()
        sp.net_param.CopyFrom(bench_nets.dummy_data_net(bench_nets.NETS[name][0], dshape, lshape))
        sp.type, sp.base_lr, sp.weight_decay, sp.lr_policy = solver_type, 0.01, 0.0005, "fixed"
        sp.momentum = 0.0 if solver_type in ("AdaGrad", "RMSProp") else 0.9  # (those two take none in Caffe)
        sp.max_iter, sp.display, sp.snapshot_after_train = 10 ** 6, 0, False
        solver = get_solver(sp)
        solver.net.ForwardBackward()
        count = sum(p.count() for p in solver.net.learnable_params)
        res = {"fused": ([], []), "passes": ([], [])}
        try:
            for _ in range(args.rounds):
                for side, mod in (("fused", kernel), ("passes", None)):
                    sgd_solver._update = mod
                    assert solver._fused() == (mod is not None)
                    res[side][0].append(bench_nets.median_ms(solver.ApplyUpdate, n))
                    res[side][1].append(bench_nets.median_ms(lambda: solver.step(1), max(3, n // 5)))
        finally:
            sgd_solver._update = kernel
        print(f"{name} ({count / 1e6:.2f} M parameters), {solver_type}:")
        for side, (upd, step) in res.items():
            print(f"  {side:7s} ApplyUpdate {statistics.median(upd):8.2f} ms   solver step {statistics.median(step):8.2f} ms")
        ratios = [f / p for f, p in zip(res["fused"][1], res["passes"][1])]
        print(f"  solver step fused / passes per round: {' '.join(f'{r:.3f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
