"""tools/analysis_tools/kernel_report.py: the SASS reader, the rooflines of
:mod:`mmeffattn.analysis.kernels`, and the compiled kernels' targets: no shuffle in the
Laplacian kernels, no spills.

The quick run compiles the Laplacian and dynamic-dwconv launches at their first GPU-check
shape for sm_90 (about 20 s); ``--run-slow`` runs the full report (every op, sm_80 and sm_90).
"""
import json
import os.path as osp

import pytest

from mmeffattn.analysis.kernels import (PEAKS, ROOFLINES, Cost, core_periphery_costs,
                                        predicted_seconds, record)
from mmeffattn.ops._spec import SPECS
from tools import gpu_check
from tools.analysis_tools import kernel_report

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/              @!P0 LDG.E.U16 R8, desc[UR4][R2.64] ;
        /*0030*/                   SHFL.BFLY PT, R22, R25, 0x4, 0x1f ;
        /*0040*/                   FADD R0, R1, -R2 ;
        /*0050*/                   SHFL.BFLY PT, R22, R25, 0x2, 0x1f ;
        /*0060*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0070*/              @!P0 BRA 0x20 ;
        /*0080*/                   STG.E desc[UR4][R2.64], R0 ;
        /*0090*/                   SHFL.IDX PT, R3, R3, RZ, 0x1f ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0;
"""


def test_sass_stats_counts_opcodes_and_loops() -> None:
    s = kernel_report.sass_stats(SASS)
    assert s['instructions'] == 12
    assert s['ldg'] == {'128': 1, '16': 1} and s['stg'] == {'32': 1}
    assert s['tensor_core'] == 1 and s['wgmma'] == 0
    # the backward branch 0x70 -> 0x20 is a loop holding two of the three shuffles; the
    # branch to itself at the end (the trap) is not a loop
    assert s['shfl'] == 3 and s['shfl_in_loops'] == 2 and s['loops'] == 1


def test_rooflines_name_gpu_checks_and_predict_positive_times() -> None:
    """Every op has a roofline, each at a GPU check's shapes (the name of a case of
    ``tools/gpu_check.py`` whose first word starts the op's name)."""
    assert {r.op for r in ROOFLINES.values()} == {s.name for s in SPECS}
    checks = {name for name, _ in gpu_check.KERNEL_CASES}
    for name, r in ROOFLINES.items():
        assert name in checks and r.op.startswith(name.split()[0]), name
        for dtype in ('bf16', 'fp32'):
            costs = r.costs(dtype)
            assert set(costs) == {'fwd', 'bwd'}
            for cost in costs.values():
                assert cost.bytes > 0 and cost.launches >= 1
                assert predicted_seconds(cost, 'H200', dtype) <= \
                    predicted_seconds(cost, 'H100', dtype)


def test_predicted_seconds_is_the_roofline() -> None:
    hbm = PEAKS['H100']['hbm']
    assert predicted_seconds(Cost(int(hbm)), 'H100', 'bf16') == pytest.approx(1.0)
    compute = Cost(1, fp32=int(PEAKS['H100']['fp32']), tc=int(PEAKS['H100']['tc16']))
    assert predicted_seconds(compute, 'H100', 'bf16') == pytest.approx(2.0)
    # fp32 inputs run their dots as tf32
    assert predicted_seconds(Cost(1, tc=int(PEAKS['H100']['tf32'])), 'H100',
                             'fp32') == pytest.approx(1.0)


def test_sema_roofline_launches_are_the_kernels_and_the_mean_glue() -> None:
    """SEMA as the backbone calls it (q, k packed, the mean returned): the roofline's launches
    are the kernels the launchers issue plus, forward, the sum of the windows' partial value
    sums and, in 16-bit dtypes, the mean's cast, and nothing else: no pass over v or dO for
    the mean, nothing for autograd."""
    for r in (r for r in ROOFLINES.values() if r.op == 'sema_attention'):
        for dtype in ('bf16', 'fp32'):
            roles = [launch.role for launch in record(dict(r.aot_case, dtype=dtype))]
            now = r.costs(dtype)
            assert now['fwd'].launches == roles.count('fwd') + 1 + (dtype != 'fp32')
            assert now['bwd'].launches == len(roles) - roles.count('fwd')


def test_core_periphery_fused_backward_models_less_traffic() -> None:
    """The fused backward (P and dS of every pair computed once, fp32 atomics, no split) moves
    fewer bytes and does fewer tensor-core FLOPs than the deterministic one (every pair visited
    twice), at the GPU-check shapes, with and without table gradients."""
    for shape in [(8, 6, 64, 196, 64), (2, 6, 64, 1024, 64)]:
        for rope_grad in (False, True):
            for dtype in ('bf16', 'fp32'):
                fused = core_periphery_costs(*shape, rope_grad=rope_grad)(dtype)['bwd']
                separate = core_periphery_costs(*shape, rope_grad=rope_grad,
                                                fused=False)(dtype)['bwd']
                assert fused.bytes < separate.bytes and fused.tc < separate.tc
                assert fused.launches <= separate.launches


def test_core_periphery_roofline_launches_are_the_kernels() -> None:
    """The roofline's launches are the kernels the launchers issue (recorded at the roofline's
    AOT case, the default fused backward) plus the zeroing of the atomics' buffer: delta, the
    patch rows, every key, the cores' dq."""
    for r in (r for r in ROOFLINES.values() if r.op == 'core_periphery_attention'):
        for dtype in ('bf16', 'fp32'):
            roles = [launch.role for launch in record(dict(r.aot_case, dtype=dtype))]
            fwd = [role for role in roles if role.startswith('fwd')]
            assert roles[len(fwd):] == ['bwd_preprocess', 'bwd_patches', 'bwd_keys',
                                        'bwd_dq_cores']
            # (the forward's core launch splits on a GPU, not in this CPU recording; the fused
            # backward never splits)
            assert r.costs(dtype)['bwd'].launches == len(roles) - len(fwd) + 1  # + torch.zeros


def test_gpu_check_prints_measured_next_to_predicted(tmp_path, capsys) -> None:
    """The harness times a case with a roofline and records both (here the reference on the
    CPU stands in for the kernels on a GPU)."""
    r = gpu_check.check_kernels(str(tmp_path), device='cpu', backend='reference',
                                dtypes=('float32', ), only='dynamic_weight', timing=True)
    assert r['status'] == 'ok'
    row = json.loads((tmp_path / 'kernels.json').read_text())[0]
    assert row['measured_us'] > 0 and row['predicted_us'] > 0 and row['predicted_for'] == 'H100'
    assert 'predicted' in capsys.readouterr().out


def _check_report(out_dir, quick: bool) -> dict:
    with open(osp.join(out_dir, 'kernels.json')) as f:
        report = json.load(f)
    kernels = report['kernels']
    assert kernels
    print('\n'.join(kernel_report.kernel_table(kernels)))
    spills = [k for k in kernels if k['stack'] or k['local']]
    assert not spills, spills
    lap = [k for k in kernels if k['op'] == 'laplacian_kernel']
    assert {k['kernel'] for k in lap} == {'laplacian_fwd_kernel', 'laplacian_bwd_kernel'}
    # the L1 distance and both gradients accumulate in per-thread registers: no shuffle at all
    assert all(k['shfl'] == 0 and k['shfl_in_loops'] == 0 for k in lap), lap
    # the fused backward is one launch
    assert len({k['role'] for k in lap}) == 2
    md = open(osp.join(out_dir, 'kernels.md')).read()
    assert 'predictions' in md and 'laplacian_bwd_kernel' in md
    assert any(r['op'] == 'laplacian_kernel' and r['pass_'] == 'fwd+bwd'
               and r['predicted_us']['H100'] > 0 for r in report['rooflines'])
    assert {k['arch'] for k in kernels} == ({90} if quick else {80, 90})
    return report


def test_quick_report(tmp_path) -> None:
    pytest.importorskip('triton')
    rc = kernel_report.main(['--quick', '--ops', 'laplacian_kernel', 'dynamic_dwconv',
                             '--out-dir', str(tmp_path)])
    assert rc == 0
    report = _check_report(tmp_path, quick=True)
    dw = [k for k in report['kernels'] if k['kernel'] == 'dynamic_dwconv_bwd_kernel']
    assert dw and all(k['programs'] >= 1 for k in dw)


@pytest.mark.slow
def test_full_report(tmp_path) -> None:
    pytest.importorskip('triton')
    assert kernel_report.main(['--out-dir', str(tmp_path)]) == 0
    report = _check_report(tmp_path, quick=False)
    assert {k['op'] for k in report['kernels']} == {s.name for s in SPECS}
