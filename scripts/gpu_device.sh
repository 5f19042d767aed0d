#!/usr/bin/env bash
# Run tools/gpu_check.py on a CUDA machine that has PyTorch and Triton but not the OpenMMLab
# stack or network access, from a copy of this repository there.
#
#   bash scripts/gpu_device.sh [--time-limit SECONDS] [gpu_check.py arguments]
#
# Prepare with `bash scripts/gpu_wheels.sh` on a machine with PyPI access and copy `.whl/` along
# (docs/perf/gpu.md). It installs those wheels into a private folder, runs gpu_check (every step,
# or those given with --steps; --dry-run tries the plumbing on a CPU) and packs the out-dir into
# gpu_check.tar.gz beside a copy of gpu_check.json, in $OUT when set, else in work_dirs/.
# --time-limit stops gpu_check after that many seconds (default 575: the sum of its step limits
# with room to start; 0 for none), leaving what it finished in the archive. Exit status:
# gpu_check's (124 when it hit the limit).
#
# Environment: MMEFFATTN_GPU_PYTHON_BIN (python3), MMEFFATTN_GPU_WHEELS (.whl),
# MMEFFATTN_GPU_LIMIT_S (the default of --time-limit).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${MMEFFATTN_GPU_PYTHON_BIN:-python3}"
WHEELS="${MMEFFATTN_GPU_WHEELS:-.whl}"
LIMIT="${MMEFFATTN_GPU_LIMIT_S:-575}"
if [[ "${1:-}" == --time-limit ]]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "--time-limit takes a number of seconds" >&2; exit 2; }
  LIMIT="$2"
  shift 2
fi
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

timeout "$LIMIT" "$PY" tools/gpu_check.py --out-dir "$OUT_DIR" "$@"
rc=$?
DEST="${OUT:-$ROOT/work_dirs}"
mkdir -p "$DEST"
tar -czf "$DEST/gpu_check.tar.gz" -C "$WORK" gpu_check
cp "$OUT_DIR/gpu_check.json" "$DEST/" 2>/dev/null || true
echo "[gpu_device] exit $rc; $DEST/gpu_check.tar.gz"
rm -rf "$WORK"
exit $rc
