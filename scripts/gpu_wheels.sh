#!/usr/bin/env bash
# Download the wheels that `scripts/gpu_device.sh` installs on an offline GPU machine.
#
# Such a machine (e.g. a CUDA container image with Python 3.12, PyTorch, Triton, numpy, OpenCV,
# matplotlib and pytest) has none of the OpenMMLab stack and may not reach PyPI. mmeffattn needs mmengine
# and mmcv's Python part (mmcv.cnn; mmcv-lite is mmcv 2.1.0 without the compiled ops, which
# tools/gpu_check.py does not use); tools/benchmark.py's peers (Swin, ConvNeXt, ResNet) come from
# mmpretrain. All are pure Python, so they are fetched for that machine's Python and carried:
#
#   bash scripts/gpu_wheels.sh            # writes .whl/ (about 3 MB, ignored by git)
#   then, on the GPU machine, with .whl/ copied along: bash scripts/gpu_device.sh
#
# Environment: MMEFFATTN_GPU_PYTHON (default 3.12), the Python version of the GPU machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.whl"
PYVER="${MMEFFATTN_GPU_PYTHON:-3.12}"

# Exact versions, so that what runs there is what requirements/ pins here. Each line is a package
# and the dependencies such an image lacks (it has numpy, pyyaml, rich, matplotlib,
# opencv, pillow, packaging, click, markdown, einops).
WHEELS=(
  mmengine==0.10.7 addict==2.4.0 yapf==0.43.0 platformdirs==4.14.9 termcolor==3.3.0
  mmcv-lite==2.1.0
  mmpretrain==1.2.0 mat4py==0.6.0 modelindex==0.0.2 model-index==0.1.11 ordered-set==4.1.0
  importlib-metadata==8.7.0
)

rm -rf "$DEST"
mkdir -p "$DEST"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp --platform any \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}" 2> >(grep -v 'is ignored: it is neither' >&2)
n=$(ls "$DEST"/*.whl | wc -l)
if [[ "$n" -ne "${#WHEELS[@]}" ]]; then
  echo "[gpu_wheels] expected ${#WHEELS[@]} wheels in $DEST, found $n" >&2
  exit 1
fi
echo "[gpu_wheels] $n wheels, $(du -sh "$DEST" | cut -f1), in $DEST"
