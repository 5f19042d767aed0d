"""tools/analysis_tools/compare_official_kernels.py on the CPU: the official operators are CUDA
only, so a stand-in module with their Python interface (written from their source: keys as
[B, h, D, M], the L1 distance without the exponential, NewtonInverse of mat + 0.01 I with the
true inverse's gradient) checks the tool's glue against our ops' references."""
import os.path as osp
import subprocess
import sys
import types

import pytest
import torch

from tools.analysis_tools import compare_official_kernels as cok

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

LAM, ITERS = 4.0, 12


def stand_in(eps: float = cok.OFFICIAL_EPS, key_layout_bdm: bool = True,
             inv_bwd_sign: float = -1.):
    """The official operators' semantics in PyTorch (``key_layout_bdm=False``: a stand-in that
    takes keys as [B, h, M, D], i.e. a wrong reading of the interface;
    ``inv_bwd_sign=1``: an inverse backward with the sign lost)."""

    def diff(q, kt):  # [B, h, N, D, M]
        kt = kt if key_layout_bdm else kt.transpose(-2, -1)
        return q.unsqueeze(-1) - kt.unsqueeze(-3)

    def fwd(q, kt, out):
        out.copy_(diff(q, kt).abs().sum(-2))

    def bwd_q(g, q, kt, dq):
        dq.copy_((diff(q, kt).sign() * g.unsqueeze(-2)).sum(-1))

    def bwd_k(g, q, kt, dkt):
        dk = -(diff(q, kt).sign() * g.unsqueeze(-2)).sum(-3)
        dkt.copy_(dk if key_layout_bdm else dk.transpose(-2, -1))

    def inv_fwd(a, out, iters):
        p = a.double() + eps * torch.eye(a.shape[-1], dtype=torch.float64)
        s = p.sum(-1).amax(-1)[..., None, None]
        v = 1.8 / s ** 2 * p
        for _ in range(iters):
            v = 2 * v - v @ p @ v
        out.copy_(v)

    def inv_bwd(g, inv, da):
        it = inv.transpose(-2, -1)
        da.copy_(inv_bwd_sign * (it @ g @ it))

    return types.SimpleNamespace(
        LaplaceSubtraction_forward=fwd, LaplaceSubtraction_backward_query=bwd_q,
        LaplaceSubtraction_backward_key=bwd_k, NewtonInverse_forward=inv_fwd,
        NewtonInverse_backward=inv_bwd)


def test_laplacian_glue_agrees_with_our_op_and_is_timed():
    cases = cok.laplace_cases(stand_in(), 'cpu', [torch.float32], LAM, shapes=[(1, 2, 13, 5, 7)])
    row = cok.compare(cases[0], tol=1e-5, rounds=2, device='cpu')
    assert row['dtype'] == 'float32'
    assert row['output_diff'] < 1e-6 and row['grad0_diff'] < 1e-5 and row['grad1_diff'] < 1e-5
    assert set(row['fwd_ms']) == set(row['fwd_bwd_ms']) == {'official', 'ours'}
    assert row['fwd_ratio'] > 0 and row['fwd_bwd_ratio'] > 0


def test_newton_glue_agrees_with_our_op():
    cases = cok.newton_cases(stand_in(), 'cpu', [torch.float32], ITERS, LAM, shapes=[(2, 1, 9)])
    row = cok.compare(cases[0], tol=1e-5, rounds=1, device='cpu')
    assert row['output_diff'] < 1e-5 and row['grad0_diff'] < 1e-5  # -V^T G V^T on both sides


@pytest.mark.parametrize('wrong', ['key_layout', 'eps', 'inverse_backward'])
def test_a_misread_interface_fails_the_check(wrong):
    """The check is what makes a timing mean anything: keys in the other layout, or another
    eps, must be caught."""
    if wrong == 'key_layout':
        cases = cok.laplace_cases(stand_in(key_layout_bdm=False), 'cpu', [torch.float32], LAM,
                                  shapes=[(1, 1, 6, 6, 6)])
    else:
        official = stand_in(eps=0.1) if wrong == 'eps' else stand_in(inv_bwd_sign=1.)
        cases = cok.newton_cases(official, 'cpu', [torch.float32], ITERS, LAM, shapes=[(1, 1, 9)])
    with pytest.raises(RuntimeError, match='do not compute the same thing'):
        cok.compare(cases[0], tol=1e-4, rounds=1, device='cpu')


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the machine-without-GPU path')
def test_stops_at_once_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, 'tools/analysis_tools/compare_official_kernels.py',
                           '--laplacianformer-root', str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == cok.NO_CUDA_EXIT and 'CUDA only' in proc.stderr


def test_missing_checkout_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='BirdWithDreams/LaplacianFormer'):
        cok.load_official(str(tmp_path), str(tmp_path / 'build'))
