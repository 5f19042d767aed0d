"""scripts/gpu_device.sh (tools/gpu_check.py on a lent GPU machine) and scripts/gpu_wheels.sh
(what it carries there): the whole pipeline in --dry-run on this CPU, its step bookkeeping, and
the carried wheels pinned like the rest of the project."""
import json
import os
import os.path as osp
import re
import subprocess
import sys
import tarfile

import pytest

from tools import gpu_check

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _script_default(name: str, var: str) -> str:
    text = open(osp.join(ROOT, 'scripts', name)).read()
    return re.search(r'\$\{' + var + r':-([^}]*)\}', text).group(1)


@pytest.mark.slow  # every step on the CPU, every model included: about a minute
def test_device_script_dry_run_packs_every_step(tmp_path):
    """The device call's whole path on this CPU: no wheels to install, every step of gpu_check
    at smoke sizes, the out-dir packed into $OUT."""
    out = tmp_path / 'out'
    out.mkdir()
    env = dict(os.environ, OUT=str(out), MMEFFATTN_GPU_PYTHON_BIN=sys.executable,
               MMEFFATTN_GPU_WHEELS=str(tmp_path / 'no-wheels'), TMPDIR=str(tmp_path))
    proc = subprocess.run(['bash', 'scripts/gpu_device.sh', '--dry-run'], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ['gpu_check.json', 'gpu_check.tar.gz']
    summary = json.loads((out / 'gpu_check.json').read_text())
    assert summary['dry_run'] and summary['steps'] == list(gpu_check.STEP_LIMITS)
    assert {s: summary[s]['status'] for s in gpu_check.STEP_LIMITS} == \
        dict.fromkeys(gpu_check.STEP_LIMITS, 'ok')
    with tarfile.open(out / 'gpu_check.tar.gz') as tar:
        names = set(tar.getnames())
        backbones = json.load(tar.extractfile('gpu_check/backbones/benchmark.json'))
        versions = tar.extractfile('gpu_check/versions.txt').read().decode()
    assert {f'gpu_check/{f}' for f in ('gpu_check.json', 'gpu_check.md', 'kernels.json',
                                       'op_tests.log',
                                       'benchmark_ops.log', 'benchmark.log',
                                       'ops/benchmark_ops.json')} <= names
    assert 'torch' in versions and 'mmengine' in versions
    from mmeffattn.analysis.model_zoo import MODEL_ZOO
    ran = {r['model'] for r in backbones['results'] if r['status'] == 'ok'}
    assert {name for name, spec in MODEL_ZOO.items() if spec.ours} <= ran
    assert not list(tmp_path.glob('mmeffattn-gpu.*'))  # its scratch folder is removed


def test_run_step_reports_exit_status_and_time_limit(tmp_path):
    ok = gpu_check.run_step('a', [sys.executable, '-c', 'print(1)'], str(tmp_path), 60)
    bad = gpu_check.run_step('b', [sys.executable, '-c', 'raise SystemExit(3)'], str(tmp_path), 60)
    slow = gpu_check.run_step('c', [sys.executable, '-c', 'import time; time.sleep(30)'],
                              str(tmp_path), 1)
    assert (ok['status'], bad['status'], slow['status']) == \
        ('ok', 'FAIL (exit 3)', 'FAIL (time limit 1 s)')
    assert (tmp_path / 'a.log').read_text().strip() == '1'


def test_step_limits_leave_room_to_pack_up():
    limit = int(_script_default('gpu_device.sh', 'MMEFFATTN_GPU_LIMIT_S'))
    assert sum(gpu_check.STEP_LIMITS.values()) + 10 <= limit < 600  # the device call's 600 s


def test_op_tests_on_the_gpu_leave_out_the_cpu_compiles():
    args = gpu_check.parse_args(['--out-dir', 'x'])
    cmd = gpu_check.step_commands(args)
    assert 'tests/ops/test_aot.py' in cmd['op_tests'] and '-x' not in cmd['op_tests']
    assert cmd['benchmark'][cmd['benchmark'].index('--preset') + 1] == 'gpu'
    dry = gpu_check.step_commands(gpu_check.parse_args(['--out-dir', 'x', '--dry-run']))
    assert dry['benchmark'][dry['benchmark'].index('--device') + 1] == 'cpu'


def test_carried_wheels_have_the_versions_the_project_pins():
    text = open(osp.join(ROOT, 'scripts', 'gpu_wheels.sh')).read()
    block = text[text.index('WHEELS=('):text.index(')', text.index('WHEELS=('))]
    carried = dict(re.findall(r'([A-Za-z0-9_.-]+)==([0-9][A-Za-z0-9.]*)', block))
    constraints = open(osp.join(ROOT, 'requirements', 'constraints.txt')).read()
    pins = dict(re.findall(r'^([A-Za-z0-9_.-]+)==([0-9][A-Za-z0-9.]*)', constraints, re.M))
    pins['mmcv-lite'] = pins['mmcv']  # the same release, without the compiled ops
    for name in ('mmengine', 'mmpretrain', 'mmcv-lite'):
        assert carried[name] == pins[name], name


def test_official_kernels_step_is_optional_and_needs_its_checkout():
    assert 'official_kernels' not in gpu_check.parse_args(['--out-dir', 'x']).steps
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--steps', 'official_kernels'])
    args = gpu_check.parse_args(['--out-dir', 'x', '--steps', 'kernels', 'official_kernels',
                                 '--laplacianformer-root', '.official/LaplacianFormer'])
    cmd = gpu_check.step_commands(args)['official_kernels']
    assert 'tools/analysis_tools/compare_official_kernels.py' in cmd
    assert cmd[cmd.index('--laplacianformer-root') + 1] == '.official/LaplacianFormer'
    assert gpu_check.OPTIONAL_STEP_LIMITS['official_kernels'] + 10 <= \
        int(_script_default('gpu_device.sh', 'MMEFFATTN_GPU_LIMIT_S'))


def test_summary_tables_put_measured_next_to_predicted(tmp_path):
    (tmp_path / 'kernels.json').write_text(json.dumps([
        dict(case='sema B8', dtype='bfloat16', status='ok', measured_us=50.0, predicted_us=20.0,
             predicted_for='H200', roofline_fraction=0.4),
        dict(case='newton B2', dtype='float32', status='FAIL', error='AssertionError: RMS')]))
    (tmp_path / 'official_kernels.json').write_text(json.dumps(dict(rows=[
        dict(case='laplacian B8', dtype='float16', fwd_ms=dict(official=2.0, ours=1.0),
             fwd_ratio=0.5, fwd_bwd_ms=dict(official=6.0, ours=3.0), fwd_bwd_ratio=0.5,
             output_diff=3e-4),
        dict(case='newton B2', dtype='float32', error='RuntimeError: differs')])))
    summary = dict(dry_run=False, steps=['kernels', 'official_kernels'],
                   environment=dict(time='t', torch='2.11', triton_version='3.6.0',
                                    python='3.12', gpu='NVIDIA H200', capability='9.0'),
                   kernels=dict(status='FAIL', seconds=3.0),
                   official_kernels=dict(status='ok', seconds=90.0))
    md = gpu_check.summary_markdown(summary, str(tmp_path))
    assert md.startswith('# gpu_check: NVIDIA H200') and 'Triton 3.6.0' in md
    assert '| kernels | FAIL | 3.0 |' in md
    assert '| sema B8 | bfloat16 | ok | 50.0 | 20.0 (H200) | 40% |  |' in md
    assert 'AssertionError: RMS' in md
    assert '| laplacian B8 | float16 | 1.000 / 2.000 (0.50x) | 3.000 / 6.000 (0.50x) | 3.0e-04 |' \
        in md
    assert 'RuntimeError: differs' in md
