#!/usr/bin/env bash
# Train on a Slurm cluster, one task per GPU (the OpenMMLab form):
#   GPUS=16 GPUS_PER_NODE=8 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS...]
# Environment: GPUS (total, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5),
# SRUN_ARGS (extra srun arguments, e.g. "--quotatype=reserved"), PYTHON (default python).
# ARGS go to tools/train.py (e.g. --resume, --amp, --cfg-options compile=True).
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] $0 PARTITION JOB_NAME CONFIG WORK_DIR [ARGS...]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# shellcheck disable=SC2086  # SRUN_ARGS is a list of words
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "${PYTHON:-python}" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher slurm "$@"
