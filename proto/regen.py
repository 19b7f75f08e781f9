#!/usr/bin/env python
"""Regenerate ``src/caffe/proto/caffe_pb2.py`` from ``caffe.proto``.

Needs ``grpcio-tools`` (it bundles ``protoc``)::

    pip install grpcio-tools
    python proto/regen.py              # rewrite the checked-in module
    python proto/regen.py --out DIR    # write DIR/caffe_pb2.py instead

The generated module is checked in; ``tests/test_proto_regen.py`` regenerates
it into a temporary folder and compares it with the checked-in file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "caffe.proto"
PACKAGE_DIR = HERE / "src" / "caffe" / "proto"


def generate(out_dir: Path | str = PACKAGE_DIR) -> Path:
    """Run grpc_tools' protoc on caffe.proto; return the path of caffe_pb2.py."""
    from grpc_tools import protoc  # imported here: only this script needs it

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Run from the proto folder with a relative file name so that the
    # descriptor's file name ("caffe.proto") and the output do not depend on
    # where the repository lives.
    args = [
        "grpc_tools.protoc",
        f"-I{HERE}",
        f"--python_out={out_dir}",
        str(PROTO),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
    return out_dir / "caffe_pb2.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR,
                        help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    path = generate(args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
