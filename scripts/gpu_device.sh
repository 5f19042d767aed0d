#!/usr/bin/env bash
# Run tools/gpu_check.py on an offline GPU machine, from a copy of this repository there.
#
# Prepare with `bash scripts/gpu_wheels.sh` on a machine with PyPI access and copy `.whl/` along
# (docs/perf/gpu.md). It installs those wheels into a private folder, runs every step of
# gpu_check under a time limit that leaves room to pack up, and packs the out-dir into
# $OUT/gpu_check.tar.gz beside $OUT/gpu_check.json ($OUT defaults to work_dirs/). Arguments go
# to gpu_check.py (e.g. --steps kernels benchmark, or --dry-run to try the
# plumbing on a CPU). Exit status: gpu_check's (124 when it hit the limit).
#
# Environment: MMEFFATTN_GPU_PYTHON_BIN (python3), MMEFFATTN_GPU_WHEELS (.whl),
# MMEFFATTN_GPU_LIMIT_S (575: seconds for gpu_check).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${MMEFFATTN_GPU_PYTHON_BIN:-python3}"
WHEELS="${MMEFFATTN_GPU_WHEELS:-.whl}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mmeffattn-gpu.XXXXXX")"
OUT_DIR="$WORK/gpu_check"
mkdir -p "$OUT_DIR"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$WORK/site" "$WHEELS"/*.whl || exit 3
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  >"$OUT_DIR/nvidia-smi.csv" 2>&1 || true
"$PY" -c 'import sys, torch, triton, mmcv, mmengine
print("python", sys.version.split()[0], "torch", torch.__version__, "triton",
      triton.__version__, "mmcv", mmcv.__version__, "mmengine", mmengine.__version__)' \
  2>&1 | tee "$OUT_DIR/versions.txt"

timeout "${MMEFFATTN_GPU_LIMIT_S:-575}" "$PY" tools/gpu_check.py --out-dir "$OUT_DIR" "$@"
rc=$?
DEST="${OUT:-$ROOT/work_dirs}"
mkdir -p "$DEST"
tar -czf "$DEST/gpu_check.tar.gz" -C "$WORK" gpu_check
cp "$OUT_DIR/gpu_check.json" "$DEST/" 2>/dev/null || true
echo "[gpu_device] exit $rc; $DEST/gpu_check.tar.gz"
rm -rf "$WORK"
exit $rc
