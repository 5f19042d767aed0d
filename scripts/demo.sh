#!/usr/bin/env bash
# Set everything up (idempotent), then run the demo: Mask R-CNN + SEMA-T trained and evaluated on
# a synthetic COCO-format dataset the project generates itself. Extra arguments go to
# tools/demo.py (see `python tools/demo.py --help`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
PYTHON="${VIRTUAL_ENV:-$ROOT/.venv}/bin/python"
cd "$ROOT"
exec "$PYTHON" tools/demo.py "$@"
