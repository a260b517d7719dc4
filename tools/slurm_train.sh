#!/usr/bin/env bash
# Training on a slurm cluster: one task per GPU, mmengine reads the slurm environment.
#   [GPUS=16 GPUS_PER_NODE=8 SIGNAL_AHEAD_S=300] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args...]
# slurm sends SIGUSR1 to every task SIGNAL_AHEAD_S seconds before the time limit (and SIGTERM when it
# preempts): train.py finishes the iteration, writes a checkpoint and exits with code 75; requeue
# with --resume.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=${4:-work_dirs/$JOB_NAME}
export SRUN_ARGS="--signal=USR1@${SIGNAL_AHEAD_S:-300} ${SRUN_ARGS:-}"
exec bash "$(dirname "$0")/launch.sh" slurm train.py "$PARTITION" "$JOB_NAME" "$CONFIG" \
    --work-dir="$WORK_DIR" --launcher slurm "${@:5}"
