"""The LeNet digits run that real BVLC Caffe timed at 26 s on this machine (up to 38 s under load).

Setup of ../shared/reference/lenet (its README): the digits LMDBs (records 0..1499 train, 1500..1796 test,
raw 1x28x28 Datums, keys '%08d'), lenet_digits_train_test.prototxt, lenet_ref_solver.prototxt's
hyperparameters, here for 500 iterations (test every 100 with 3 test iterations, display every 100).
Prints the wall time of `caffe-cli train` (process start to exit) and the final test accuracy.

    python bench/lenet_digits_500.py [--iterations 500]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT.parent / "shared" / "reference" / "lenet"


def build_lmdbs(folder: Path) -> None:
    from caffe.layers.db import write_db
    from caffe.proto import caffe_pb2
    images = np.load(REF / "data" / "digits_28x28_uint8.npy")
    labels = np.load(REF / "data" / "digits_labels.npy")

    def records(lo, hi):
        for i in range(lo, hi):
            d = caffe_pb2.Datum(channels=1, height=28, width=28, data=images[i].tobytes(), label=int(labels[i]))
            yield b"%08d" % i, d.SerializeToString()

    write_db(str(folder / "digits_train_lmdb"), records(0, 1500))
    write_db(str(folder / "digits_test_lmdb"), records(1500, len(images)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=500)
    args = ap.parse_args()
    if not REF.exists():
        print(f"needs BVLC Caffe's LeNet reference setup at {REF}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_lmdbs(folder)
        shutil.copy(REF / "lenet_digits_train_test.prototxt", folder)
        solver = (REF / "lenet_ref_solver.prototxt").read_text()
        solver = re.sub(r"max_iter: \d+", f"max_iter: {args.iterations}", solver)
        solver = re.sub(r"display: \d+", "display: 100", solver)
        (folder / "solver.prototxt").write_text(solver)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "caffe.cli.main", "train", "--solver=solver.prototxt"],
                              cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        acc = re.findall(r"Test net output #\d+: accuracy = ([\d.]+)", proc.stderr)
        print(f"LeNet on the digits LMDB, {args.iterations} iterations (batch 64, test every 100): "
              f"{wall:.1f} s wall (real Caffe: 26 s quiet, 38 s under load); final test accuracy {acc[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
