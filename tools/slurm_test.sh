#!/usr/bin/env bash
# Testing on a slurm cluster.
#   [GPUS=8 GPUS_PER_NODE=8] bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
exec bash "$(dirname "$0")/launch.sh" slurm test.py "$PARTITION" "$JOB_NAME" "$CONFIG" "$CHECKPOINT" \
    --launcher slurm "${@:5}"
