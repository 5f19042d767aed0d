#!/usr/bin/env bash
# Distributed testing with torchrun: bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args]
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROCS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The interpreter: $PYTHON if set; else the active venv/conda env's python; else the project's
# .venv (the README's set-up) when it exists; else python from PATH.
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" && -x "$DIR/../.venv/bin/python" ]]; then
        PYTHON="$DIR/../.venv/bin/python"
    else
        PYTHON=python
    fi
fi

PYTHONPATH="$DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROCS" --master_port="$PORT" \
    "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
