#!/usr/bin/env bash
# The first check on a machine with an NVIDIA GPU (issue 14, item 5): one script, under 8 minutes, one report.
#
#   bash scripts/gpu_check.sh [REPORT]        # default: gpu_check_report.md in the repository root
#
# Stages, each with a time limit, each failure recorded (the script goes on) and the whole within
# GPU_CHECK_BUDGET seconds (default 470; a stage that would not fit is recorded as skipped):
#   install      scripts/install.sh, then the cuda extra (cuda12/cuda13 from nvidia-smi, or CUDA_EXTRA) and NCCL;
#                GPU_CHECK_WHEELS=DIR installs from a folder of wheels (offline machines)
#   device       caffe-cli device_query
#   gpu-tests    every gpu-marked test and CPU/GPU parity property, with real numerics (pytest -m gpu), the
#                hand-written CUDA kernels' parity properties included (the [gpu] cases of
#                packages/layers/tests/test_layers_device_kernels.py: col2im, pooling, Softmax(WithLoss),
#                BatchNorm, LRN, Dropout, the neurons, Scale, Bias, Eltwise; they run only on a real GPU)
#   device-paths bench/bench_device_paths.py: im2col/col2im, pooling and the memory-bound layers on the
#                device, kernels on and off
#   train-time   caffe-cli time --gpu=0 on LeNet, CIFAR10-quick and CaffeNet (bench/bench_nets.py's DummyData nets)
#   two-gpus     the 2-GPU NCCL equivalence test, and 1- vs 2-GPU training throughput (CIFAR10-quick,
#                GPU_CHECK_TRAIN_ITERS iterations, default 200, displayed every 20)
#   inference    bench/bench_infer.py (ResNet-50, MobileNet) when it exists
#   pytorch      the same training nets in PyTorch CUDA, when PyTorch is there or installs in time
# GPU_CHECK_REHEARSE=1 runs every stage on the CuPy stand-in instead (no GPU, no installs; LeNet for the
# throughput): it checks this script itself; its figures are NOT GPU figures and the report says so.
# Other knobs: GPU_CHECK_ITERS (caffe-cli time / PyTorch iterations, default 20), GPU_CHECK_TORCH=0 (no PyTorch
# install), GPU_CHECK_TORCH_PYTHON (a Python that has PyTorch), GPU_CHECK_TAIL (report lines per stage, 40),
# GPU_CHECK_NETS (default lenet,cifar10_quick,caffenet), GPU_CHECK_SKIP (stage names to leave out, e.g. gpu-tests).
set -u
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
REPORT=${1:-$ROOT/gpu_check_report.md}
BUDGET=${GPU_CHECK_BUDGET:-470}
REHEARSE=${GPU_CHECK_REHEARSE:-0}
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
PY=$ROOT/.venv/bin/python
SUMMARY=()
trap 'rm -rf "$WORK"' EXIT

now() { date +%s; }
left() { echo $((BUDGET - ($(now) - START))); }
say() { echo "$*" | tee -a "$REPORT"; }

# stage NAME LIMIT_S COMMAND...: run with a timeout, append its status and the tail of its output to the report
stage() {
  local name=$1 limit=$2 rest log t0 rc status
  shift 2
  case ",${GPU_CHECK_SKIP:-}," in
    *",$name,"*) note "$name" "GPU_CHECK_SKIP" && return 0 ;;
  esac
  rest=$(($(left) - ${RESERVE:-20}))  # the last, cheap stage (the table) keeps its seconds
  if [ "$rest" -lt 15 ]; then
    SUMMARY+=("$name: SKIPPED (out of time: ${rest}s of the ${BUDGET}s budget left)")
    say "" && say "## $name: SKIPPED (out of time)"
    return 0
  fi
  [ "$limit" -gt "$((rest - 5))" ] && limit=$((rest - 5))
  log=$WORK/$name.log
  echo "== $name (limit ${limit}s)" >&2
  t0=$(now)
  if [ "$(type -t "$1")" = function ]; then  # timeout runs programs: a shell function runs in a child bash
    export -f "${1?}"
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  fi
  rc=$?
  case $rc in
    0) status="ok" ;;
    124 | 137) status="TIMEOUT after ${limit}s" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  SUMMARY+=("$name: $status ($(($(now) - t0))s)")
  say "" && say "## $name: $status ($(($(now) - t0))s)" && say ""
  {
    echo '```'
    tail -n "${GPU_CHECK_TAIL:-40}" "$log"
    echo '```'
  } >>"$REPORT"
  return 0
}

note() {  # a stage that was not run, with the reason
  SUMMARY+=("$1: skipped ($2)")
  say "" && say "## $1: skipped ($2)"
}

: >"$REPORT"
say "# GPU check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
say ""
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${BUDGET}s"

if [ "$REHEARSE" = "1" ]; then
  export CAFFE_CUPY_STANDIN=1
  say ""
  say "**REHEARSAL on the CuPy stand-in (GPU_CHECK_REHEARSE=1): NumPy on the host, NO GPU RAN; every figure"
  say "below is a CPU figure and only shows that the stages run.**"
else
  unset CAFFE_CUPY_STANDIN
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  stage nvidia-smi 20 nvidia-smi
  CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
else
  CUDA_MAJOR=""
fi
EXTRA=${CUDA_EXTRA:-cuda${CUDA_MAJOR:-12}}
[ "$EXTRA" = "cuda12" ] || [ "$EXTRA" = "cuda13" ] || EXTRA=cuda12  # CUDA 11 or a newer major: try cuda12
export ROOT PY EXTRA WORK
GPU_CHECK_NETS=${GPU_CHECK_NETS:-lenet,cifar10_quick,caffenet}
TRAIN_NET=cifar10_quick TRAIN_BATCH=100  # the net of the 1- vs 2-GPU throughput
[ "$REHEARSE" = "1" ] && TRAIN_NET=lenet TRAIN_BATCH=64

# --- install -------------------------------------------------------------------------------------------
install_all() {
  bash scripts/install.sh || return 1
  local pipargs=(-q)
  [ -n "${GPU_CHECK_WHEELS:-}" ] && pipargs+=(--no-index --find-links "$GPU_CHECK_WHEELS")
  "$PY" -m pip install "${pipargs[@]}" --no-build-isolation -e "packages/blob[$EXTRA]" \
    -e "packages/parallel[nccl-$EXTRA]" || return 1
  "$PY" -c "import cupy; print('CuPy', cupy.__version__, '-', cupy.cuda.runtime.getDeviceCount(), 'device(s)')"
}
if [ "$REHEARSE" = "1" ]; then
  if [ -x "$PY" ]; then note install "rehearsal: the existing .venv is used"; else stage install 240 bash scripts/install.sh; fi
else
  stage install 240 install_all
fi

if [ ! -x "$PY" ]; then
  say "" && say "No .venv/bin/python: nothing else can run."
else
  # --- the device ------------------------------------------------------------------------------------
  stage device 30 "$PY" -m caffe.cli.main device_query --gpu=0
  NGPU=$("$PY" -c "from caffe.blob import context; print(context.gpu_count())" 2>/dev/null | tail -n 1)
  [[ "$NGPU" =~ ^[0-9]+$ ]] || NGPU=0
  say "" && say "visible GPUs: $NGPU (cuda extra: $EXTRA)"

  if [ "$NGPU" -lt 1 ]; then
    note gpu-tests "no usable GPU (see device)"
  else
    # --- every gpu-marked test and CPU/GPU parity property, with real numerics ----------------------
    # (the hand-written kernels first, so their report lines are not cut: they had never run before)
    stage kernel-parity 90 "$PY" -m pytest -q -m gpu -p no:randomly -rfEs \
      packages/layers/tests/test_layers_device_kernels.py
    stage gpu-tests 180 "$PY" -m pytest -q -m gpu -p no:randomly -rfEs \
      --ignore=packages/layers/tests/test_layers_device_kernels.py
    # --- the device paths of issue 14 item 4 (lowering, pooling, memory-bound layers), kernels on and off ---
    stage device-paths 90 "$PY" bench/bench_device_paths.py

    # --- training speed -----------------------------------------------------------------------------
    stage prepare-nets 60 "$PY" scripts/gpu_check.py prepare "$WORK/nets"
    for net in ${GPU_CHECK_NETS//,/ }; do
      if [ -f "$WORK/nets/$net.prototxt" ]; then
        stage "time-$net" 90 "$PY" -m caffe.cli.main time --model="$WORK/nets/$net.prototxt" --gpu=0 \
          --iterations="${GPU_CHECK_ITERS:-20}"
        cp "$WORK/time-$net.log" "$WORK/nets/time_$net.log" 2>/dev/null
      fi
    done

    # --- two GPUs: NCCL equivalence and throughput ---------------------------------------------------
    if [ "$NGPU" -ge 2 ]; then
      stage two-gpu-equivalence 120 "$PY" -m pytest -q -p no:randomly -rfEs \
        packages/parallel/tests/test_parallel_nccl.py -k two_gpus
      solver=$WORK/nets/${TRAIN_NET}_solver.prototxt
      if [ -f "$solver" ]; then
        sed -i "s/^max_iter: .*/max_iter: ${GPU_CHECK_TRAIN_ITERS:-200}/" "$solver"
        stage train-1gpu 90 "$PY" -m caffe.cli.main train --solver="$solver" --gpu=0
        stage train-2gpus 120 "$PY" -m caffe.cli.main train --solver="$solver" --gpu=0,1
        stage two-gpu-throughput 20 "$PY" scripts/gpu_check.py throughput "$WORK/train-1gpu.log" \
          "$WORK/train-2gpus.log" --batch "$TRAIN_BATCH"
      fi
    else
      note two-gpus "$NGPU GPU visible: the 2-GPU NCCL test and throughput need two"
    fi

    # --- inference (another helper's bench/bench_infer.py) ---------------------------------------------
    if [ -f bench/bench_infer.py ]; then
      if "$PY" bench/bench_infer.py --help 2>/dev/null | grep -q -- "--gpu"; then
        stage inference 120 "$PY" bench/bench_infer.py --gpu=0
      else
        stage inference 120 "$PY" bench/bench_infer.py
        say "(bench/bench_infer.py has no --gpu flag: these may be CPU figures)"
      fi
    else
      note inference "bench/bench_infer.py is not in this checkout yet"
    fi

    # --- PyTorch CUDA side by side -----------------------------------------------------------------------
    TORCH_PY=${GPU_CHECK_TORCH_PYTHON:-}
    TORCH_DEVICE=cuda
    [ "$REHEARSE" = "1" ] && TORCH_DEVICE=cpu
    if [ -z "$TORCH_PY" ] && python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
      2>/dev/null; then
      TORCH_PY=python3
    fi
    if [ -z "$TORCH_PY" ] && [ "$REHEARSE" != "1" ] && [ "${GPU_CHECK_TORCH:-1}" != "0" ]; then
      install_torch() {
        python3 -m venv "$WORK/torch" && "$WORK/torch/bin/python" -m pip install -q torch
      }
      stage torch-install 150 install_torch
      [ -x "$WORK/torch/bin/python" ] && "$WORK/torch/bin/python" -c "import torch" 2>/dev/null \
        && TORCH_PY=$WORK/torch/bin/python
    fi
    if [ -n "$TORCH_PY" ]; then
      stage pytorch 120 "$TORCH_PY" scripts/gpu_check.py torch "$WORK/nets/torch.json" --device "$TORCH_DEVICE" \
        --iterations "${GPU_CHECK_ITERS:-20}" --nets "$GPU_CHECK_NETS"
    else
      note pytorch "PyTorch is not installed and did not install (GPU_CHECK_TORCH_PYTHON=... names one)"
    fi
    [ -d "$WORK/nets" ] && RESERVE=0 stage train-table 20 "$PY" scripts/gpu_check.py time-table "$WORK/nets"
  fi
fi

say ""
say "## Summary ($(($(now) - START))s of the ${BUDGET}s budget)"
say ""
for line in "${SUMMARY[@]}"; do say "- $line"; done
[ "$REHEARSE" = "1" ] && say "" && say "**Rehearsal on the CuPy stand-in: no GPU ran.**"
echo "report: $REPORT" >&2
