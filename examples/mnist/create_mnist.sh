#!/usr/bin/env bash
# Build examples/mnist/mnist_{train,test}_lmdb from the real digits shipped in data/mnist/
# (as Caffe's examples/mnist/create_mnist.sh does from the downloaded MNIST). Run from the repo root:
#     ./examples/mnist/create_mnist.sh            # BACKEND=leveldb for LevelDB (needs plyvel)
set -euo pipefail

EXAMPLE=examples/mnist
DATA=data/mnist
BACKEND=${BACKEND:-lmdb}

if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "Run this from the repository root (no $DATA/train-images-idx3-ubyte.gz here)." >&2
  exit 1
fi

echo "Creating ${BACKEND}..."

rm -rf "$EXAMPLE/mnist_train_${BACKEND}" "$EXAMPLE/mnist_test_${BACKEND}"

caffe-cli convert_mnist_data "$DATA/train-images-idx3-ubyte.gz" \
  "$DATA/train-labels-idx1-ubyte.gz" "$EXAMPLE/mnist_train_${BACKEND}" --backend="${BACKEND}"
caffe-cli convert_mnist_data "$DATA/t10k-images-idx3-ubyte.gz" \
  "$DATA/t10k-labels-idx1-ubyte.gz" "$EXAMPLE/mnist_test_${BACKEND}" --backend="${BACKEND}"

echo "Done."
