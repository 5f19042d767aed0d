"""scripts/setup.sh's mmcv decision (scripts/mmcv_plan.py), on faked CUDA machines.

``MMEFFATTN_SETUP_DRY_RUN=1`` makes setup.sh print how it would get mmcv and stop; the plan reads
the GPUs torch sees from ``MMEFFATTN_FAKE_CUDA_CAPABILITY`` and finds a fake toolkit (a ``nvcc``
script that prints a release) on ``PATH``. Nothing is installed or built.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SETUP = osp.join(ROOT, 'scripts', 'setup.sh')
LIBRARY_HEADERS = ('cublas_v2.h', 'cusparse.h', 'cusolverDn.h')


def fake_toolkit(root, release: str = '13.0', library_headers: bool = True) -> str:
    """A CUDA_HOME-like folder whose bin/nvcc prints ``release`` as nvcc does."""
    home = root / f'cuda-{release}'
    (home / 'bin').mkdir(parents=True)
    (home / 'include').mkdir()
    nvcc = home / 'bin' / 'nvcc'
    nvcc.write_text('#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
                    f'echo "Cuda compilation tools, release {release}, V{release}.88"\n')
    nvcc.chmod(0o755)
    (home / 'include' / 'cuda_runtime.h').write_text('')
    if library_headers:
        for header in LIBRARY_HEADERS:
            (home / 'include' / header).write_text('')
    return str(home)


def dry_run(capability: str, path_dirs=(), **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ('CUDA_HOME', 'CUDA_PATH', 'TORCH_CUDA_ARCH_LIST', 'CPATH', 'MAX_JOBS')}
    env.update(MMEFFATTN_SETUP_DRY_RUN='1', MMEFFATTN_FAKE_CUDA_CAPABILITY=capability,
               MMEFFATTN_CUDA_DEFAULT_HOMES='',  # no real toolkit of this machine is found
               VIRTUAL_ENV=osp.dirname(osp.dirname(sys.executable)),
               PATH=os.pathsep.join([*path_dirs, '/usr/bin', '/bin']), MAX_JOBS='3')
    env.update(extra)
    return subprocess.run(['bash', SETUP], capture_output=True, text=True, env=env, timeout=120)


def test_cuda_machine_builds_cuda_ops_for_its_gpu(tmp_path):
    home = fake_toolkit(tmp_path)
    proc = dry_run('9.0', [osp.join(home, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0')
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'nothing is installed' in proc.stderr
    assert 'CUDA ops for compute capability 9.0' in out
    build = next(ln for ln in out.splitlines() if 'otherwise build:' in ln)
    assert 'FORCE_CUDA=1' in build and 'MMCV_WITH_OPS=1' in build
    assert 'TORCH_CUDA_ARCH_LIST=9.0 ' in build
    assert f'CUDA_HOME={home} ' in build and 'MAX_JOBS=3' in build
    assert 'FORCE_CUDA=0' not in out
    assert 'CPATH' not in build  # the fake toolkit has the library headers itself
    # a prebuilt wheel counts only if its ops run on a CUDA tensor: the CPU-ops wheel cannot
    assert 'kept only if nms and roi_align run on a cuda tensor' in out
    assert 'run on a cpu tensor' not in out


def test_every_gpu_architecture_is_built(tmp_path):
    home = fake_toolkit(tmp_path)
    proc = dry_run('8.0,9.0', [osp.join(home, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TORCH_CUDA_ARCH_LIST='8.0;9.0'" in proc.stdout
    # a user's own TORCH_CUDA_ARCH_LIST wins
    proc = dry_run('9.0', [osp.join(home, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0',
                   TORCH_CUDA_ARCH_LIST='9.0a')
    assert 'TORCH_CUDA_ARCH_LIST=9.0a ' in proc.stdout


def test_cuda_home_is_preferred_to_path(tmp_path):
    on_path = fake_toolkit(tmp_path / 'a')
    chosen = fake_toolkit(tmp_path / 'b')
    proc = dry_run('9.0', [osp.join(on_path, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0',
                   CUDA_HOME=chosen)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'CUDA_HOME={chosen} ' in proc.stdout


def test_no_nvcc_says_how_to_get_it_and_stops(tmp_path):
    proc = dry_run('9.0', MMEFFATTN_FAKE_TORCH_CUDA='12.8')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert 'No CUDA toolkit (nvcc) was found' in out
    assert 'Install the CUDA toolkit 12.8' in out and 'cuda-toolkit' in out
    assert 'export CUDA_HOME=' in out and 'nvidia-cuda-nvcc package alone is not enough' in out
    assert 'otherwise build:' not in out


def test_toolkit_of_another_cuda_major_is_refused(tmp_path):
    home = fake_toolkit(tmp_path, release='12.4')
    proc = dry_run('9.0', [osp.join(home, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'is CUDA 12.4, but torch was built with CUDA 13.0' in proc.stdout
    assert 'Install the CUDA toolkit 13.0' in proc.stdout


def test_missing_library_headers_come_from_torchs_nvidia_packages(tmp_path):
    """A toolkit assembled from pip's nvidia-* wheels lacks cuBLAS/cuSPARSE/cuSOLVER headers;
    torch's own nvidia packages have them, and the build gets them through CPATH."""
    home = fake_toolkit(tmp_path, library_headers=False)
    site = tmp_path / 'site' / 'nvidia' / 'cu13' / 'include'
    site.mkdir(parents=True)
    for header in LIBRARY_HEADERS:
        (site / header).write_text('')
    proc = dry_run('9.0', [osp.join(home, 'bin')], MMEFFATTN_FAKE_TORCH_CUDA='13.0',
                   PYTHONPATH=str(tmp_path / 'site'))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'CPATH={site}' in proc.stdout


def test_missing_library_headers_nowhere_stop_the_build(tmp_path):
    home = fake_toolkit(tmp_path, library_headers=False)
    empty = tmp_path / 'empty'
    empty.mkdir()
    code = ('import sys, runpy; sys.path[:] = [p for p in sys.path if "site-packages" not in p]; '
            f'sys.argv = ["mmcv_plan.py"]; runpy.run_path({osp.join(ROOT, "scripts", "mmcv_plan.py")!r},'
            ' run_name="__main__")')
    env = dict(os.environ, MMEFFATTN_FAKE_CUDA_CAPABILITY='9.0', MMEFFATTN_FAKE_TORCH_CUDA='13.0',
               MMEFFATTN_CUDA_DEFAULT_HOMES='', CUDA_HOME=home)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 'lacks cublas_v2.h, cusparse.h, cusolverDn.h' in proc.stdout
    assert 'otherwise build:' not in proc.stdout


@pytest.mark.parametrize('capability', ['none', ''])
def test_cpu_machine_keeps_the_cpu_build(tmp_path, capability):
    home = fake_toolkit(tmp_path)  # an nvcc on PATH changes nothing without a GPU
    proc = dry_run(capability, [osp.join(home, 'bin')])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert 'CPU ops' in out and 'run on a cpu tensor' in out
    build = next(ln for ln in out.splitlines() if 'otherwise build:' in ln)
    assert 'MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=3' in build
    assert 'TORCH_CUDA_ARCH_LIST' not in out and 'CUDA_HOME' not in out


def test_shell_plan_is_what_setup_reads(tmp_path):
    """--shell prints assignments that bash can eval (setup.sh does), quoted."""
    home = fake_toolkit(tmp_path / 'with space')
    env = dict(os.environ, MMEFFATTN_FAKE_CUDA_CAPABILITY='8.6,9.0', MMEFFATTN_FAKE_TORCH_CUDA='13.0',
               MMEFFATTN_CUDA_DEFAULT_HOMES='', CUDA_HOME=home)
    env.pop('TORCH_CUDA_ARCH_LIST', None)
    script = (f'eval "$({sys.executable} {osp.join(ROOT, "scripts", "mmcv_plan.py")} --shell)"; '
              'echo "$MMCV_DEVICE|$MMCV_FLAVOR|$MMCV_CUDA_HOME"; eval "env $MMCV_BUILD_ENV" '
              'printenv FORCE_CUDA TORCH_CUDA_ARCH_LIST CUDA_HOME')
    proc = subprocess.run(['bash', '-c', script], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f'cuda|cuda13.0-sm86_90|{home}'
    assert lines[1:] == ['1', '8.6;9.0', home]
