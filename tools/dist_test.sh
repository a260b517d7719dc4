#!/usr/bin/env bash
# Multi-GPU / multi-node testing through torchrun (mmengine handles the distribution).
#   bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args...]
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_test.sh CONFIG CKPT 8
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
exec bash "$(dirname "$0")/launch.sh" torchrun test.py "$GPUS" "$CONFIG" "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
