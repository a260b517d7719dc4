#!/usr/bin/env bash
# What the four launchers (dist_train.sh, dist_test.sh, slurm_train.sh, slurm_test.sh) share: start
# tools/SCRIPT (train.py or test.py) in several processes, with this checkout first on PYTHONPATH
# and .venv's python (or $PYTHON); mmengine handles the distribution.
#   bash tools/launch.sh torchrun SCRIPT GPUS [SCRIPT args...]
#     GPUS processes per node; NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500)
#   bash tools/launch.sh slurm SCRIPT PARTITION JOB_NAME [SCRIPT args...]
#     one task per GPU; GPUS (8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python )}
export PYTHONPATH="$ROOT:${PYTHONPATH:-}"
# say which python runs ($PYTHON when set, else the checkout's .venv when it exists, else python)
echo "tools/launch.sh: $("$PYTHON" -c 'import sys, torch; print(sys.executable, "- python", sys.version.split()[0], "- torch", torch.__version__, "- CUDA GPUs:", torch.cuda.device_count())' 2>&1 | tail -n1)" >&2
SCRIPT=$ROOT/tools/$2
case $1 in
  torchrun)
    "$PYTHON" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
        --nproc_per_node="$3" "$SCRIPT" "${@:4}" ;;
  slurm)
    GPUS_PER_NODE=${GPUS_PER_NODE:-8}
    # SRUN_ARGS unquoted: it holds several srun options
    srun -p "$3" --job-name="$4" --gres=gpu:"$GPUS_PER_NODE" --ntasks="${GPUS:-8}" \
        --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="${CPUS_PER_TASK:-5}" \
        --kill-on-bad-exit=1 ${SRUN_ARGS:-} "$PYTHON" -u "$SCRIPT" "${@:5}" ;;
  *)
    echo "tools/launch.sh: unknown mode '$1' (torchrun or slurm)" >&2
    exit 2 ;;
esac
