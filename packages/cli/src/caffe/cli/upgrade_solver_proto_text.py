"""upgrade_solver_proto_text: rewrite a text SolverParameter in an old format (solver_type enum -> type string) in the latest format (Caffe's tools/upgrade_solver_proto_text.cpp).

    caffe-cli upgrade_solver_proto_text IN OUT

The upgrade itself is caffe.net.upgrade's; a file already in the latest format is
written out unchanged (and said so).
"""
from __future__ import annotations

from caffe.cli._upgrade import run


def main(argv: list[str]) -> int:
    return run(argv, "upgrade_solver_proto_text", "solver", binary=False)
