"""tools/benchmark_ops.py on tiny sizes, and tools/gpu_check.py: its no-GPU exit and its
kernel-vs-reference harness (run here reference against reference)."""
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmeffattn.analysis.flops import op_macs, sdpa_macs
from mmeffattn.ops._spec import CORE_PERIPHERY
from tools import benchmark, benchmark_ops, gpu_check

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_smoke_run(tmp_path):
    report = benchmark_ops.main(['--preset', 'smoke', '--tokens', '49', '196', '--repeats', '1',
                                 '--out-dir', str(tmp_path)])
    saved = json.loads((tmp_path / 'benchmark_ops.json').read_text())
    assert saved['results'] == report['results']
    m = report['machine']
    assert m['matmul']['flops_per_s'] > 1e8 and m['copy']['bytes_per_s'] > 1e8
    rows = {(r['kind'], r['N']): r for r in report['results']}
    # on a CPU only PyTorch runs: the baselines and our ops' torch backend (never the Triton
    # interpreter)
    assert {r['backend'] for r in report['results']} == {'torch'}
    assert len(rows) == 2 * len(benchmark_ops.KINDS)
    for r in report['results']:
        assert r['status'] == 'ok', r
        assert r['ms'] > 0 and r['flops_per_s'] == pytest.approx(2 * r['macs'] / r['ms'] * 1e3)
        assert 0 < r['of_roofline'] and r['roofline_flops_per_s'] <= m['matmul']['flops_per_s']
    B, h, D = 1, 2, 32
    assert rows['softmax', 196]['macs'] == sdpa_macs(B * h, 196, 196, D, D)
    q = torch.empty(B, h, 196, D)
    assert rows['sema', 196]['macs'] == op_macs('sema_attention', q, q, q, (14, 14), 7)
    # the windows and the cores make fewer pairs than all N^2
    assert rows['sema', 196]['macs'] < rows['softmax', 196]['macs']
    assert rows['core_periphery', 196]['tokens'] == 196 + CORE_PERIPHERY.settings['num_cores']
    assert rows['laplacian_nystrom', 196]['landmarks'] == 4  # 14x14 grid in 8x8 cells
    md = (tmp_path / 'benchmark_ops.md').read_text()
    assert 'GFLOP/s' in md and '| 196 | softmax | torch |' in md
    assert set(report['exponents']) == {
        'softmax[torch]', 'linear[torch]', 'sema[torch]', 'core_periphery[torch]',
        'laplacian_nystrom[torch]', 'dynamic_linear[torch]', 'dynamic_dwconv[torch]'}
    # WeightFormer's mixers: 2x2-pooled tokens (7x7 of 14x14) over h * D = 64 channels
    u = torch.empty(1, 49, 64)
    assert rows['dynamic_linear', 196]['macs'] == op_macs('dynamic_weight', u, u, 196) + \
        196 * 64 * 64
    assert rows['dynamic_dwconv', 196]['macs'] == 64 * 196 * 9


def test_linear_attention_baseline_is_exact():
    q, k, v = (torch.randn(1, 2, 10, 4, dtype=torch.float64) for _ in range(3))
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    w = fq @ fk.transpose(-2, -1)
    expected = (w / w.sum(-1, keepdim=True)) @ v
    torch.testing.assert_close(benchmark_ops.linear_attention(q, k, v), expected, rtol=1e-6,
                               atol=1e-8)


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the machine-without-GPU path')
def test_gpu_check_stops_at_once_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, 'tools/gpu_check.py', '--out-dir', str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == gpu_check.NO_CUDA_EXIT
    assert 'no CUDA device' in proc.stderr and 'NVIDIA GPU' in proc.stderr
    assert not (tmp_path / 'gpu_check.json').exists()


def test_kernel_harness_passes_the_reference_and_catches_a_wrong_kernel(tmp_path, monkeypatch):
    # the real cases, reference against its fp64 self, in both dtypes
    r = gpu_check.check_kernels(str(tmp_path), device='cpu', backend='reference',
                                dtypes=('float32', 'bfloat16'), only='dynamic_weight')
    assert r == dict(status='ok', checked=2, failed=0)

    def off_by_a_bit(device, dtype):
        x = torch.randn(64, 64, device=device).to(dtype)
        return (lambda b, x: x * 1.05 if b == 'triton' else x), [x]  # a 5% error

    monkeypatch.setattr(gpu_check, 'KERNEL_CASES', [('wrong', off_by_a_bit)])
    r = gpu_check.check_kernels(str(tmp_path), device='cpu', backend='triton',
                                dtypes=('float32', ))
    assert r['status'] == 'FAIL' and r['failed'] == 1
    rows = json.loads((tmp_path / 'kernels.json').read_text())
    assert 'RMS error' in rows[0]['error']


@pytest.mark.slow
def test_kernel_harness_every_case_on_cpu(tmp_path):
    r = gpu_check.check_kernels(str(tmp_path), device='cpu', backend='reference')
    assert r['status'] == 'ok' and r['checked'] == 2 * len(gpu_check.KERNEL_CASES)


def test_gpu_presets_fit_their_steps_of_the_gpu_script():
    """Each variant may overrun its budget by one size (warm-up + repeats at the per-call
    limit); the worst case must still end inside the step's time limit."""
    from mmeffattn.analysis.model_zoo import MODEL_ZOO
    p = benchmark.PRESETS['gpu']
    worst = len(MODEL_ZOO) * (p['budget_s'] + (p['warmup'] + p['repeats']) * p['max_call_s'])
    assert p['no_flops'] and worst < gpu_check.STEP_LIMITS['benchmark'] - 20  # 20 s to build
    p = benchmark_ops.PRESETS['gpu']
    ours = len(benchmark_ops.KINDS) - len(benchmark_ops.BASELINES)
    variants = len(benchmark_ops.BASELINES) + 2 * ours  # our ops with Triton and torch
    worst = variants * (p['budget_s'] + (p['warmup'] + p['repeats']) * p['max_call_s'])
    assert worst < gpu_check.STEP_LIMITS['benchmark_ops'] - 10
