#!/usr/bin/env bash
# Multi-GPU / multi-node training through torchrun (mmengine handles the distribution).
#   bash tools/dist_train.sh CONFIG GPUS [train.py args...]
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh CONFIG 8
set -euo pipefail
CONFIG=$1
GPUS=$2
exec bash "$(dirname "$0")/launch.sh" torchrun train.py "$GPUS" "$CONFIG" --launcher pytorch "${@:3}"
