#!/usr/bin/env bash
# Set everything up (idempotent) and run the test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh tests/ops -k sema` or `bash scripts/test.sh --run-slow`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
PYTHON="${VIRTUAL_ENV:-$ROOT/.venv}/bin/python"
cd "$ROOT"
exec "$PYTHON" -m pytest "$@"
