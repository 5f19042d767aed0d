#!/usr/bin/env bash
# Set up mmeffattn and its pinned OpenMMLab stack in a virtual environment.
#
# Uses the active virtual environment if there is one, otherwise creates `.venv/` at the project
# root. Idempotent: on a machine that is already set up it checks a stamp and returns in seconds.
# The exact versions come from requirements/constraints.txt (the extras themselves are ranges).
#
# mmcv's compiled ops: where torch sees a CUDA GPU, mmcv gets CUDA ops built for the GPUs'
# compute capability (FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST), which needs a CUDA toolkit whose major
# version matches torch's; elsewhere CPU ops. scripts/mmcv_plan.py makes that decision.
#
# Environment:
#   MMEFFATTN_PYTHON       interpreter used to create .venv (default: python3.11, then python3)
#   MMEFFATTN_WHEEL_CACHE  where built mmcv wheels are kept, keyed by torch version and by CPU or
#                          CUDA build (default: ~/.cache/mmeffattn/wheels)
#   MMEFFATTN_MMCV_WHEEL_DIRS  extra colon-separated folders with prebuilt mmcv wheels, each kept
#                          only if its ops run on this machine's device (a CUDA tensor where torch
#                          sees a GPU); default: none
#   MMEFFATTN_SETUP_DRY_RUN=1  print how mmcv would be obtained, then stop (installs nothing)
#   CUDA_HOME, TORCH_CUDA_ARCH_LIST, MAX_JOBS  as for any torch extension build
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CONSTRAINTS="$ROOT/requirements/constraints.txt"
pinned() {  # pinned NAME: the version requirements/constraints.txt pins
  sed -n "s/^$1==\([^ #]*\).*/\1/p" "$CONSTRAINTS"
}
TORCH_VERSION="$(pinned torch)"
TORCHVISION_VERSION="$(pinned torchvision)"
MMCV_VERSION="$(pinned mmcv)"

log() { printf '[setup] %s\n' "$*" >&2; }

# --- 1. the virtual environment --------------------------------------------------------------
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  VENV="$VIRTUAL_ENV"
  log "using the active virtual environment $VENV"
else
  VENV="$ROOT/.venv"
  if [[ ! -x "$VENV/bin/python" && "${MMEFFATTN_SETUP_DRY_RUN:-0}" != "1" ]]; then
    PY="${MMEFFATTN_PYTHON:-$(command -v python3.11 || command -v python3)}"
    log "creating $VENV with $PY"
    "$PY" -m venv "$VENV"
  fi
fi
PYTHON="$VENV/bin/python"
PIP=("$PYTHON" -m pip --disable-pip-version-check -q)
PIP_C=("${PIP[@]}" install -c "$CONSTRAINTS")

# --- 2. dry run: how mmcv would be obtained ---------------------------------------------------
if [[ "${MMEFFATTN_SETUP_DRY_RUN:-0}" == "1" ]]; then
  log "dry run: nothing is installed"
  [[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"
  if [[ -z "${MMEFFATTN_FAKE_CUDA_CAPABILITY+x}" ]] && ! "$PYTHON" -c "import torch" 2>/dev/null; then
    log "torch $TORCH_VERSION would be installed first; how mmcv is built depends on what it sees"
    exit 0
  fi
  "$PYTHON" "$ROOT/scripts/mmcv_plan.py" --mmcv-version "$MMCV_VERSION"
  PLAN="$("$PYTHON" "$ROOT/scripts/mmcv_plan.py" --shell)"
  eval "$PLAN"
  [[ -z "$MMCV_ERROR" ]] || exit 1
  exit 0
fi

# --- 3. fast path: nothing changed since the last successful set-up ---------------------------
IMPORT_CHECK="import mmeffattn, mmcv.ops, mmdet, mmseg, mmpretrain, onnx, onnxruntime, onnxscript"
IMPORT_CHECK+=", safetensors, mim, build, sphinx, myst_parser, furo"
stamp_key() {
  cat "$ROOT/scripts/setup.sh" "$ROOT/scripts/mmcv_plan.py" "$ROOT/requirements/"*.txt \
    "$ROOT/setup.py" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16
}
# one interpreter start: everything imports, and the build flavor (cpu, or e.g. cuda13.0-sm90:
# a set-up for one is not a set-up for the other) is printed
FLAVOR="$("$PYTHON" -c "$IMPORT_CHECK
import runpy, sys
sys.argv = [sys.argv[1], '--flavor']
runpy.run_path(sys.argv[0], run_name='__main__')" "$ROOT/scripts/mmcv_plan.py" 2>/dev/null)" \
  || FLAVOR=""
FLAVOR="${FLAVOR##*$'\n'}"  # the last line, should an import print anything
if [[ -n "$FLAVOR" && -f "$VENV/.mmeffattn-setup-$(stamp_key)-$FLAVOR" ]]; then
  log "already set up ($VENV)"
  exit 0
fi

# --- 4. torch, build tools --------------------------------------------------------------------
have_version() {  # have_version MODULE VERSION
  "$PYTHON" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib, sys
m = importlib.import_module(sys.argv[1])
sys.exit(0 if m.__version__.split('+')[0] == sys.argv[2] else 1)
EOF
}
if ! have_version torch "$TORCH_VERSION" || ! have_version torchvision "$TORCHVISION_VERSION"; then
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION (a few minutes)"
  "${PIP_C[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
# mmcv's setup.py imports pkg_resources (gone in setuptools 81) and needs torch at build time;
# mmcv itself imports mmengine and cv2, so they come first (a wheel is checked by importing it).
"${PIP_C[@]}" setuptools wheel ninja numpy mmengine opencv-python addict packaging Pillow pyyaml \
  yapf

PLAN="$("$PYTHON" "$ROOT/scripts/mmcv_plan.py" --shell)"  # set -e: a failing plan stops here
eval "$PLAN"
STAMP="$VENV/.mmeffattn-setup-$(stamp_key)-$MMCV_FLAVOR"

# --- 5. mmcv with its ops (CPU, or CUDA where torch sees a GPU), built against this torch -------
mmcv_ok() {  # mmcv_ok [-v]: mmcv imports and its nms and roi_align run on $MMCV_DEVICE
  local err=/dev/null
  [[ "${1:-}" == "-v" ]] && err=/dev/stderr
  "$PYTHON" - "$MMCV_VERSION" "$MMCV_DEVICE" <<'EOF' >/dev/null 2>"$err"
import sys
import torch, mmcv
from mmcv.ops import nms, roi_align
version, device = sys.argv[1], sys.argv[2]
assert mmcv.__version__ == version, mmcv.__version__
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]], device=device)
keep = nms(boxes, torch.tensor([0.9, 0.8], device=device), 0.5)[1]
assert keep.tolist() == [0], keep
out = roi_align(torch.ones(1, 1, 8, 8, device=device),
                torch.tensor([[0., 0., 0., 4., 4.]], device=device), (2, 2), 1.0, 2)
assert out.shape == (1, 1, 2, 2) and out.device.type == device, out
EOF
}
TORCH_TAG="torch-$("$PYTHON" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
WHEEL_CACHE="${MMEFFATTN_WHEEL_CACHE:-$HOME/.cache/mmeffattn/wheels}/$TORCH_TAG/$MMCV_FLAVOR"
mkdir -p "$WHEEL_CACHE"

try_mmcv_wheel() {  # try_mmcv_wheel PATH: install it and keep it only if its ops run here
  local whl="$1"
  log "trying prebuilt $whl (its ops must run on $MMCV_DEVICE)"
  "${PIP[@]}" install --no-deps --force-reinstall "$whl" || return 1
  if mmcv_ok -v; then return 0; fi
  log "  $whl does not run its ops on $MMCV_DEVICE with this torch (error above); discarding it"
  "${PIP[@]}" uninstall -y mmcv >/dev/null 2>&1 || true
  return 1
}

build_mmcv() {
  local tmp
  if [[ -n "$MMCV_ERROR" ]]; then  # CUDA, but no usable toolkit: say how to get one, and stop
    printf '%s\n' "$MMCV_ERROR" >&2
    exit 1
  fi
  tmp="$(mktemp -d)"
  log "building mmcv $MMCV_VERSION from source with $MMCV_BUILD_ENV"
  log "(CPU ops: about 20 minutes on 2 cores)"
  "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d "$tmp"
  tar -xzf "$tmp"/mmcv-"$MMCV_VERSION".tar.gz -C "$tmp"
  # torch 2.14's headers need C++20; mmcv 2.1.0 hard-codes an older standard after CXXFLAGS.
  sed -i -e 's/-std=c++14/-std=c++20/g' -e 's/-std=c++17/-std=c++20/g' "$tmp/mmcv-$MMCV_VERSION/setup.py"
  # MMCV_BUILD_ENV: NAME=VALUE words, each quoted by the plan for the shell
  (cd "$tmp/mmcv-$MMCV_VERSION" && eval "env $MMCV_BUILD_ENV" \
     '"$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$WHEEL_CACHE" .')
  rm -rf "$tmp"
}

if ! mmcv_ok; then
  installed=0
  candidates=("$WHEEL_CACHE"/mmcv-"$MMCV_VERSION"-*.whl)
  extra_dirs="${MMEFFATTN_MMCV_WHEEL_DIRS:-}"
  IFS=: read -r -a dirs <<<"$extra_dirs"
  for d in "${dirs[@]}"; do candidates+=("$d"/mmcv-"$MMCV_VERSION"-*.whl); done
  for whl in "${candidates[@]}"; do
    [[ -f "$whl" ]] || continue
    if try_mmcv_wheel "$whl"; then
      installed=1
      # keep a verified copy in the torch- and device-keyed cache for the next set-up
      [[ "$(dirname "$whl")" == "$WHEEL_CACHE" ]] || cp -f "$whl" "$WHEEL_CACHE/" || true
      break
    fi
  done
  if [[ $installed == 0 ]]; then
    build_mmcv
    try_mmcv_wheel "$(ls -t "$WHEEL_CACHE"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)" \
      || { log "the freshly built mmcv does not run its ops on $MMCV_DEVICE"; exit 1; }
  fi
fi

# --- 6. the OpenMMLab stack, the extras and mmeffattn itself ----------------------------------
log "installing the OpenMMLab stack, the extras (all, deploy, tests, docs) and mmeffattn"
"${PIP_C[@]}" -r requirements/runtime.txt -r requirements/deploy.txt -r requirements/tests.txt \
  -r requirements/docs.txt
"${PIP[@]}" install --no-deps --no-build-isolation -e .
"$PYTHON" -W ignore::UserWarning -c "$IMPORT_CHECK"  # mim warns that pkg_resources is deprecated

rm -f "$VENV"/.mmeffattn-setup-*
touch "$STAMP"
log "ready: $VENV"
