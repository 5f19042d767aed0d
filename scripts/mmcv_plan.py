#!/usr/bin/env python
"""Decide how scripts/setup.sh gets mmcv's compiled ops: CPU ops, or CUDA ops for the local GPUs.

    python scripts/mmcv_plan.py            # the plan, in words
    python scripts/mmcv_plan.py --shell    # the plan as shell assignments (what setup.sh reads)
    python scripts/mmcv_plan.py --flavor   # cpu, or e.g. cuda13.0-sm90 (setup.sh's stamp)

Where torch sees a CUDA GPU, mmcv must be built with ``FORCE_CUDA=1`` for the GPUs' compute
capabilities (``TORCH_CUDA_ARCH_LIST``), with an nvcc whose CUDA major version matches
``torch.version.cuda``; a prebuilt wheel is kept only if its ops run on a CUDA tensor. Otherwise
mmcv is built with CPU ops (``FORCE_CUDA=0``). The decision reads torch and the environment only,
so it can be tested without a GPU through these variables (read by this script alone):

* ``MMEFFATTN_FAKE_CUDA_CAPABILITY``: ``9.0`` (or ``8.0,9.0`` for several GPUs) stands for a
  machine where torch sees CUDA GPUs of those capabilities; ``none`` for one where it sees none;
* ``MMEFFATTN_FAKE_TORCH_CUDA``: the ``torch.version.cuda`` to assume (e.g. ``13.0``);
* ``MMEFFATTN_CUDA_DEFAULT_HOMES``: colon-separated toolkit folders tried after ``CUDA_HOME``,
  ``CUDA_PATH`` and the ``nvcc`` on ``PATH`` (default ``/usr/local/cuda``).
"""
import argparse
import glob
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

# The headers torch's own CUDA headers (ATen/cuda/CUDAContextLight.h) include besides the
# toolkit's runtime headers; mmcv's CUDA ops include those torch headers.
LIBRARY_HEADERS = ('cublas_v2.h', 'cusparse.h', 'cusolverDn.h')


def torch_view() -> Tuple[str, Optional[str], List[str]]:
    """(torch version, torch.version.cuda, ['9.0', ...] capabilities of the visible GPUs)."""
    fake_cap = os.environ.get('MMEFFATTN_FAKE_CUDA_CAPABILITY')
    fake_cuda = os.environ.get('MMEFFATTN_FAKE_TORCH_CUDA')
    if fake_cap is not None:
        try:
            from importlib.metadata import version
            torch_version = version('torch')
        except Exception:
            torch_version = 'unknown'
        caps = [] if fake_cap.strip().lower() in ('', 'none') else \
            [c.strip() for c in fake_cap.split(',') if c.strip()]
        return torch_version, fake_cuda or ('13.0' if caps else None), caps
    import torch
    caps = []
    if torch.cuda.is_available():
        caps = sorted({'%d.%d' % torch.cuda.get_device_capability(i)
                       for i in range(torch.cuda.device_count())})
    return torch.__version__, fake_cuda or torch.version.cuda, caps


def _nvcc_release(nvcc: str) -> Optional[str]:
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'release (\d+\.\d+)', out)
    return m.group(1) if m else None


def find_cuda_home() -> Tuple[Optional[str], Optional[str], List[str]]:
    """(toolkit folder, its nvcc's CUDA release, folders looked at): the first folder with an
    executable bin/nvcc and include/cuda_runtime.h among CUDA_HOME, CUDA_PATH, the nvcc on
    PATH (a wrapper script's own folder is skipped when it has no include/) and the defaults."""
    candidates = [os.environ.get('CUDA_HOME'), os.environ.get('CUDA_PATH')]
    on_path = shutil.which('nvcc')
    if on_path:
        candidates.append(osp.dirname(osp.dirname(osp.realpath(on_path))))
    defaults = os.environ.get('MMEFFATTN_CUDA_DEFAULT_HOMES', '/usr/local/cuda')
    candidates += defaults.split(':')
    seen = []
    for home in candidates:
        if not home or home in seen:
            continue
        seen.append(home)
        nvcc = osp.join(home, 'bin', 'nvcc')
        if (os.access(nvcc, os.X_OK)
                and osp.isfile(osp.join(home, 'include', 'cuda_runtime.h'))):
            release = _nvcc_release(nvcc)
            if release:
                return home, release, seen
    return None, None, seen


def library_header_dirs(cuda_home: str) -> Tuple[List[str], List[str]]:
    """(extra include folders, headers found nowhere) for LIBRARY_HEADERS: a toolkit installed
    by NVIDIA's installer has them; one put together from pip's nvidia-* packages may not, and
    then torch's own nvidia packages (site-packages/nvidia/*/include) usually do."""
    missing = [h for h in LIBRARY_HEADERS if not osp.isfile(osp.join(cuda_home, 'include', h))]
    if not missing:
        return [], []
    pip_dirs = []
    for path in sys.path:
        pip_dirs += sorted(glob.glob(osp.join(path, 'nvidia', '*', 'include')))
    extra, still = [], []
    for header in missing:
        found = [d for d in pip_dirs if osp.isfile(osp.join(d, header))]
        if found:
            if found[0] not in extra:
                extra.append(found[0])
        else:
            still.append(header)
    return extra, still


def no_toolkit_message(torch_cuda: Optional[str], looked: List[str], detail: str) -> str:
    want = torch_cuda or 'the CUDA version of your torch build'
    major = torch_cuda.split('.')[0] if torch_cuda else 'X'
    return (
        f'torch sees a CUDA GPU, so mmcv needs its CUDA ops (RoIAlign, NMS, ... for Mask R-CNN '
        f'and RetinaNet), compiled with nvcc against this torch. {detail}\n'
        f'Folders looked at: {", ".join(looked) or "none"} (CUDA_HOME, CUDA_PATH, the nvcc on '
        f'PATH, /usr/local/cuda).\n'
        f'Install the CUDA toolkit {want} (the major version must be {major}, as torch was built '
        f'with CUDA {want}): NVIDIA\'s cuda-toolkit-{want.replace(".", "-")} package or runfile, '
        f'or `conda install -c nvidia cuda-toolkit={want}`; then `export CUDA_HOME=<its '
        f'folder>` and run scripts/setup.sh again. pip\'s nvidia-cuda-nvcc package alone is not '
        f'enough: the build also needs the CUDA runtime headers, CCCL and NVVM of the same '
        f'release, and the cuBLAS/cuSPARSE/cuSOLVER headers that torch\'s CUDA headers '
        f'include.\nA CPU-only set-up (no CUDA ops) is what you get on a machine where torch '
        f'sees no GPU.')


def make_plan() -> Dict[str, str]:
    torch_version, torch_cuda, caps = torch_view()
    jobs = os.environ.get('MAX_JOBS') or str(os.cpu_count() or 1)
    plan = {'MMCV_TORCH': torch_version, 'MMCV_TORCH_CUDA': torch_cuda or '',
            'MMCV_CAPABILITIES': ','.join(caps), 'MMCV_ERROR': '', 'MMCV_CUDA_HOME': '',
            'MMCV_NVCC': ''}
    if not caps:
        plan.update(MMCV_DEVICE='cpu', MMCV_FLAVOR='cpu',
                    MMCV_BUILD_ENV=f'MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS={jobs}')
        return plan
    arch_list = os.environ.get('TORCH_CUDA_ARCH_LIST') or ';'.join(caps)
    flavor = 'cuda{}-sm{}'.format(torch_cuda or 'unknown',
                                  '_'.join(a.replace('.', '') for a in re.split('[; ]+', arch_list)
                                           if a))
    plan.update(MMCV_DEVICE='cuda', MMCV_FLAVOR=flavor)
    home, release, looked = find_cuda_home()
    env = ['MMCV_WITH_OPS=1', 'FORCE_CUDA=1', f'TORCH_CUDA_ARCH_LIST={shlex.quote(arch_list)}']
    if home is None:
        plan['MMCV_ERROR'] = no_toolkit_message(torch_cuda, looked, 'No CUDA toolkit (nvcc) '
                                                'was found.')
    elif torch_cuda and release.split('.')[0] != torch_cuda.split('.')[0]:
        plan['MMCV_ERROR'] = no_toolkit_message(
            torch_cuda, looked, f'The toolkit at {home} is CUDA {release}, but torch was built '
            f'with CUDA {torch_cuda}: torch refuses to build extensions across CUDA major '
            f'versions.')
    else:
        plan.update(MMCV_CUDA_HOME=home, MMCV_NVCC=release)
        env.append(f'CUDA_HOME={shlex.quote(home)}')
        extra, missing = library_header_dirs(home)
        if missing:
            plan['MMCV_ERROR'] = no_toolkit_message(
                torch_cuda, looked, f'The toolkit at {home} lacks {", ".join(missing)}, which '
                f'torch\'s CUDA headers include, and no installed nvidia-* package has them.')
        elif extra:
            cpath = ':'.join(extra + ([os.environ['CPATH']] if os.environ.get('CPATH') else []))
            env.append(f'CPATH={shlex.quote(cpath)}')
    env.append(f'MAX_JOBS={jobs}')
    plan['MMCV_BUILD_ENV'] = ' '.join(env)
    return plan


def describe(plan: Dict[str, str], mmcv_version: str) -> str:
    build = (f'{plan["MMCV_BUILD_ENV"]} pip wheel --no-deps --no-build-isolation '
             f'mmcv-{mmcv_version}/ (the PyPI source release, -std=c++20 patch)')
    if plan['MMCV_DEVICE'] == 'cpu':
        return '\n'.join([
            f'mmcv {mmcv_version}: CPU ops (torch {plan["MMCV_TORCH"]} sees no CUDA GPU)',
            '  prebuilt wheels (cache, MMEFFATTN_MMCV_WHEEL_DIRS): kept if nms and roi_align '
            'run on a cpu tensor',
            f'  otherwise build: {build}'])
    lines = [
        f'mmcv {mmcv_version}: CUDA ops for compute capability {plan["MMCV_CAPABILITIES"]} '
        f'(torch {plan["MMCV_TORCH"]}, CUDA {plan["MMCV_TORCH_CUDA"]})',
        '  prebuilt wheels (cache, MMEFFATTN_MMCV_WHEEL_DIRS): kept only if nms and roi_align '
        'run on a cuda tensor (a CPU-ops wheel fails this and is discarded)']
    if plan['MMCV_ERROR']:
        lines.append('  otherwise no build is possible:')
        lines += ['    ' + ln for ln in plan['MMCV_ERROR'].splitlines()]
    else:
        lines.append(f'  nvcc: CUDA {plan["MMCV_NVCC"]} at {plan["MMCV_CUDA_HOME"]}')
        lines.append(f'  otherwise build: {build}')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--shell', action='store_true', help='print shell assignments')
    parser.add_argument('--flavor', action='store_true',
                        help='print only the build flavor (cpu, or e.g. cuda13.0-sm90)')
    parser.add_argument('--mmcv-version', default='2.1.0')
    args = parser.parse_args(argv)
    plan = make_plan()
    if args.flavor:
        print(plan['MMCV_FLAVOR'])
    elif args.shell:
        for key, value in plan.items():
            print(f'{key}={shlex.quote(value)}')
    else:
        print(describe(plan, args.mmcv_version))
    return 0


if __name__ == '__main__':
    sys.exit(main())
