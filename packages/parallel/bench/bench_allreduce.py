"""Benchmark: MPI allreduce bandwidth between ranks, and LeNet-sized training throughput on 1 and N ranks.

    python packages/parallel/bench/bench_allreduce.py [--ranks 2] [--max-mb 256] [--iters 20]

Runs itself under mpiexec (from the venv, or PATH) and prints a table. Allreduce figures are for
MPICommunicator.allreduce (mpi4py Allreduce, in place, float32, with the watchdog on), averaged over
repetitions after a warm-up; "bus" bandwidth is NCCL-tests' convention, algbw x 2(N-1)/N. Training
runs LeNet (conv 20 - pool - conv 50 - pool - ip 500 - relu - ip 10, 431k parameters) from a
synthetic 28x28 LMDB, batch 64 per rank, SGD with momentum, layer-wise reduce; iterations/s are
measured after warm-up iterations. The NCCL path needs GPUs and is not benchmarked here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LENET = """name: "LeNet"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  transform_param { scale: 0.00390625 } data_param { source: "%(db)s" batch_size: %(batch)d backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" }
    bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" }
    bias_filler { type: "constant" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

SOLVER = """net: "%(net)s"
base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv" gamma: 0.0001 power: 0.75
display: 0 max_iter: 100000 snapshot_after_train: false random_seed: 1 layer_wise_reduce: %(lw)s
"""


# ------------------------------------------------------------------------------------------ workers

_LIMITS = []

def worker_allreduce(max_mb: int) -> None:
    from caffe.parallel.mpi_comm import MPICommunicator
    comm = MPICommunicator(timeout=600)
    n = comm.size
    mb = 1
    while mb <= max_mb:
        buf = np.ones(mb * (1 << 20) // 4, np.float32)
        comm.allreduce(buf)  # warm-up (first touch, connection set-up)
        reps, elapsed = 0, 0.0
        while reps < 3 or (elapsed < 1.0 and reps < 30):
            comm.barrier()
            t = time.perf_counter()
            comm.allreduce(buf)
            elapsed += time.perf_counter() - t
            reps += 1
        secs = comm.allgather_object(elapsed / reps)
        if comm.rank == 0:
            per = max(secs)  # the slowest rank's time is the collective's
            algbw = mb / 1024 / per
            print(json.dumps({"kind": "allreduce", "ranks": n, "mb": mb, "ms": per * 1e3, "reps": reps,
                              "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n}), flush=True)
        mb *= 4
    comm.close()


def worker_train(folder: str, iters: int, warmup: int, layer_wise: bool, threads: int = 0) -> None:
    from caffe.parallel.launch import mpi_world
    import caffe.solver
    from caffe.blob import context
    world = mpi_world()
    rank, size = (world[0], world[1]) if world else (0, 1)
    context.set_solver_count(size)
    context.set_solver_rank(rank)
    context.set_multiprocess(size > 1)
    if threads:
        from threadpoolctl import threadpool_limits
        _LIMITS.append(threadpool_limits(limits=threads))  # in force for the whole run
    s = caffe.solver.get_solver(os.path.join(folder, f"solver_{'lw' if layer_wise else 'whole'}.prototxt"))
    reducer = None
    if size > 1:
        from caffe.parallel import MPIReducer
        reducer = MPIReducer(s, timeout=600)
        reducer.bcast()
        s.add_callback(reducer)
        if reducer.layer_wise:
            s.net.after_backward(reducer)
    s.step(warmup)
    if reducer is not None:
        reducer.comm.barrier()
    t = time.perf_counter()
    s.step(iters)
    if reducer is not None:
        reducer.comm.barrier()
    secs = time.perf_counter() - t
    if rank == 0:
        batch = s.net.layers[0].layer_param.data_param.batch_size
        from threadpoolctl import threadpool_info
        blas = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=0)
        print(json.dumps({"kind": "train", "ranks": size, "layer_wise": layer_wise, "iters": iters, "threads": blas,
                          "iter_per_s": iters / secs, "images_per_s": iters * batch * size / secs,
                          "params": int(sum(b.count() for b in s.net.learnable_params))}), flush=True)
    if reducer is not None:
        reducer.close()


# ------------------------------------------------------------------------------------------ driver

def mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    found = str(cand) if cand.exists() else shutil.which("mpiexec")
    if not found:
        sys.exit("mpiexec not found: pip install 'caffe-parallel[mpi]'")
    return found


def run(n: int, args: list[str]) -> list[dict]:
    cmd = [mpiexec(), "-n", str(n), sys.executable, __file__, *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def make_data(folder: str, records: int, batch: int) -> None:
    from caffe.layers.db import DBWriter
    from caffe.proto import caffe_pb2
    rng = np.random.default_rng(0)
    db = os.path.join(folder, "lmdb")
    with DBWriter(db, "lmdb") as w:
        for i in range(records):
            d = caffe_pb2.Datum(channels=1, height=28, width=28, label=int(rng.integers(10)),
                                data=rng.integers(0, 256, 784, dtype=np.uint8).tobytes())
            w.put(f"{i:08d}", d.SerializeToString())
    net = os.path.join(folder, "lenet.prototxt")
    with open(net, "w") as f:
        f.write(LENET % {"db": db, "batch": batch})
    for tag, lw in (("lw", "true"), ("whole", "false")):
        with open(os.path.join(folder, f"solver_{tag}.prototxt"), "w") as f:
            f.write(SOLVER % {"net": net, "lw": lw})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-mb", type=int, default=256)
    p.add_argument("--iters", type=int, default=20, help="timed training iterations")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="batch per rank")
    p.add_argument("--worker", choices=["allreduce", "train"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=3, help="training runs per row (median and range shown)")
    a = p.parse_args()
    if a.worker == "allreduce":
        return worker_allreduce(a.max_mb)
    if a.worker == "train":
        return worker_train(a.folder, a.iters, a.warmup, not a.whole, a.threads)

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {a.ranks} ranks (MPI on this machine)")
    print("\n| buffer | time per allreduce | algbw | busbw |\n|---:|---:|---:|---:|")
    for r in run(a.ranks, ["--worker", "allreduce", "--max-mb", str(a.max_mb)]):
        print(f"| {r['mb']} MB | {r['ms']:.2f} ms | {r['algbw_gbs']:.2f} GB/s | {r['busbw_gbs']:.2f} GB/s |")
    folder = tempfile.mkdtemp(prefix="caffe-bench-parallel-")
    try:
        make_data(folder, records=a.batch * a.ranks * 4, batch=a.batch)
        cpus = os.cpu_count() or 1
        cases = [(1, False, 0), (1, False, max(1, cpus // a.ranks)), (a.ranks, False, 0), (a.ranks, True, 0)]
        results = {case: [] for case in cases}
        for _ in range(a.repeat):  # interleaved, so a burst of outside load hits every case alike
            for n, whole, threads in cases:
                extra = (["--whole"] if whole else []) + (["--threads", str(threads)] if threads else [])
                results[(n, whole, threads)] += run(n, ["--worker", "train", "--folder", folder, "--iters",
                                                        str(a.iters), "--warmup", str(a.warmup), *extra])
        first = results[cases[0]][0]
        print(f"\nLeNet ({first['params']} parameters), batch {a.batch} per rank, {a.iters} timed iterations, "
              f"median (min-max) of {a.repeat} runs\n")
        print("| ranks | BLAS threads per rank | reduce | iterations/s | images/s |\n|---:|---:|---|---:|---:|")
        for (n, whole, threads), rows in results.items():
            rates = sorted(r["iter_per_s"] for r in rows)
            imgs = sorted(r["images_per_s"] for r in rows)
            mode = "-" if n == 1 else ("whole" if whole else "layer-wise")
            print(f"| {n} | {rows[0]['threads']} | {mode} | {np.median(rates):.2f} ({rates[0]:.2f}-{rates[-1]:.2f}) | "
                  f"{np.median(imgs):.0f} ({imgs[0]:.0f}-{imgs[-1]:.0f}) |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
