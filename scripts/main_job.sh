#!/usr/bin/env bash
# The main job on a fresh machine (Python 3.11 and pip): install, convert the bundled real MNIST digits
# (data/mnist) to LMDB with caffe-cli convert_mnist_data, and train LeNet with caffe-cli train on
# examples/mnist/lenet_solver.prototxt. It ends with the test accuracy and the snapshot path.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install.sh
bash examples/mnist/create_mnist.sh
caffe-cli train --solver=examples/mnist/lenet_solver.prototxt "$@"
