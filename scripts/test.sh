#!/usr/bin/env bash
# Set everything up (idempotent) and run the test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh tests/ops -k sema`, `bash scripts/test.sh --run-slow`, or `-n 0` to
# run in one process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
PYTHON="${VIRTUAL_ENV:-$ROOT/.venv}/bin/python"
cd "$ROOT"
# One pytest worker per CPU core (pytest-xdist; an idle worker takes queued tests from a busy one,
# --dist worksteal), each with one intra-op thread: most tests are
# small or single-threaded Python (Triton's interpreter, mmengine's loops), so two workers on two
# cores finish about twice as fast as one process with two threads, and one thread per worker
# keeps OpenMP from spin-waiting against the other worker (which made small ops 10-50x slower).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PYTHON" -m pytest -n "${PYTEST_WORKERS:-auto}" --dist worksteal "$@"
