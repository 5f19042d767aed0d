#!/usr/bin/env bash
# Set up mmeffattn and its pinned OpenMMLab stack in a virtual environment.
#
# Uses the active virtual environment if there is one, otherwise creates `.venv/` at the project
# root. Idempotent: on a machine that is already set up it checks a stamp and returns in seconds.
#
# Environment:
#   MMEFFATTN_PYTHON       interpreter used to create .venv (default: python3.11, then python3)
#   MMEFFATTN_WHEEL_CACHE  where built mmcv wheels are kept, keyed by torch version
#                          (default: ~/.cache/mmeffattn/wheels)
#   MMEFFATTN_MMCV_WHEEL_DIRS  extra colon-separated folders with prebuilt mmcv wheels
#                          (default: ../shared/wheels beside the project, when present)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
MMCV_VERSION=2.1.0

log() { printf '[setup] %s\n' "$*" >&2; }

# --- 1. the virtual environment --------------------------------------------------------------
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  VENV="$VIRTUAL_ENV"
  log "using the active virtual environment $VENV"
else
  VENV="$ROOT/.venv"
  if [[ ! -x "$VENV/bin/python" ]]; then
    PY="${MMEFFATTN_PYTHON:-$(command -v python3.11 || command -v python3)}"
    log "creating $VENV with $PY"
    "$PY" -m venv "$VENV"
  fi
fi
PYTHON="$VENV/bin/python"
PIP=("$PYTHON" -m pip --disable-pip-version-check -q)

# --- 2. fast path: nothing changed since the last successful set-up ---------------------------
stamp_key() {
  cat "$ROOT/scripts/setup.sh" "$ROOT/requirements/"*.txt "$ROOT/setup.py" | sha256sum | cut -c1-16
}
STAMP="$VENV/.mmeffattn-setup-$(stamp_key)"
if [[ -f "$STAMP" ]] && "$PYTHON" -c "import mmeffattn, mmcv.ops, mmdet, mmseg, mmpretrain, onnx, onnxruntime, onnxscript" 2>/dev/null; then
  log "already set up ($VENV)"
  exit 0
fi

# --- 3. torch, build tools --------------------------------------------------------------------
have_version() {  # have_version MODULE VERSION
  "$PYTHON" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib, sys
m = importlib.import_module(sys.argv[1])
sys.exit(0 if m.__version__.split('+')[0] == sys.argv[2] else 1)
EOF
}
if ! have_version torch "$TORCH_VERSION" || ! have_version torchvision "$TORCHVISION_VERSION"; then
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION (a few minutes)"
  "${PIP[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
# mmcv's setup.py imports pkg_resources (gone in setuptools 81) and needs torch at build time;
# mmcv itself imports mmengine and cv2, so they come first (a wheel is checked by importing it).
"${PIP[@]}" install "setuptools<81" wheel ninja "numpy<2.4" "mmengine==0.10.7" opencv-python \
  addict packaging Pillow pyyaml yapf

# --- 4. mmcv with its CPU ops, built against this torch ---------------------------------------
mmcv_ok() {  # prints why not on stderr when given "-v"
  local err=/dev/null
  [[ "${1:-}" == "-v" ]] && err=/dev/stderr
  "$PYTHON" - <<'EOF' >/dev/null 2>"$err"
import torch, mmcv
from mmcv.ops import nms, roi_align
assert mmcv.__version__ == '2.1.0', mmcv.__version__
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]])
keep = nms(boxes, torch.tensor([0.9, 0.8]), 0.5)[1]
assert keep.tolist() == [0], keep
out = roi_align(torch.ones(1, 1, 8, 8), torch.tensor([[0., 0., 0., 4., 4.]]), (2, 2), 1.0, 2)
assert out.shape == (1, 1, 2, 2)
EOF
}
TORCH_TAG="torch-$("$PYTHON" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
WHEEL_CACHE="${MMEFFATTN_WHEEL_CACHE:-$HOME/.cache/mmeffattn/wheels}/$TORCH_TAG"
mkdir -p "$WHEEL_CACHE"

try_mmcv_wheel() {  # try_mmcv_wheel PATH: install it and keep it only if its ops load and run
  local whl="$1"
  log "trying prebuilt $whl"
  "${PIP[@]}" install --no-deps --force-reinstall "$whl" || return 1
  if mmcv_ok -v; then return 0; fi
  log "  $whl does not load or run its ops with this torch (error above); discarding it"
  "${PIP[@]}" uninstall -y mmcv >/dev/null 2>&1 || true
  return 1
}

build_mmcv() {
  local tmp
  tmp="$(mktemp -d)"
  log "building mmcv $MMCV_VERSION from source with CPU ops (about 20 minutes on 2 cores)"
  "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d "$tmp"
  tar -xzf "$tmp"/mmcv-"$MMCV_VERSION".tar.gz -C "$tmp"
  # torch 2.14's headers need C++20; mmcv 2.1.0 hard-codes an older standard after CXXFLAGS.
  sed -i -e 's/-std=c++14/-std=c++20/g' -e 's/-std=c++17/-std=c++20/g' "$tmp/mmcv-$MMCV_VERSION/setup.py"
  (cd "$tmp/mmcv-$MMCV_VERSION" && MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
     "$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$WHEEL_CACHE" .)
  rm -rf "$tmp"
}

if ! mmcv_ok; then
  installed=0
  candidates=("$WHEEL_CACHE"/mmcv-"$MMCV_VERSION"-*.whl)
  extra_dirs="${MMEFFATTN_MMCV_WHEEL_DIRS:-$ROOT/../shared/wheels}"
  IFS=: read -r -a dirs <<<"$extra_dirs"
  for d in "${dirs[@]}"; do candidates+=("$d"/mmcv-"$MMCV_VERSION"-*.whl); done
  for whl in "${candidates[@]}"; do
    [[ -f "$whl" ]] || continue
    if try_mmcv_wheel "$whl"; then
      installed=1
      # keep a verified copy in the torch-keyed cache for the next set-up
      [[ "$(dirname "$whl")" == "$WHEEL_CACHE" ]] || cp -f "$whl" "$WHEEL_CACHE/" || true
      break
    fi
  done
  if [[ $installed == 0 ]]; then
    build_mmcv
    try_mmcv_wheel "$(ls "$WHEEL_CACHE"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)" \
      || { log "the freshly built mmcv does not load its ops"; exit 1; }
  fi
fi

# --- 5. the OpenMMLab stack, test tools and mmeffattn itself ----------------------------------
log "installing the OpenMMLab stack, the deploy extra (onnx, onnxruntime) and mmeffattn"
"${PIP[@]}" install -r requirements/runtime.txt -r requirements/tests.txt -r requirements/deploy.txt
"${PIP[@]}" install --no-deps --no-build-isolation -e .
"$PYTHON" -c "import mmeffattn, mmcv.ops, mmdet, mmseg, mmpretrain, onnx, onnxruntime, onnxscript"

rm -f "$VENV"/.mmeffattn-setup-*
touch "$STAMP"
log "ready: $VENV"
