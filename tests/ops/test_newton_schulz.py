"""Newton-Schulz inverse: Triton kernels (interpreted on CPU, compiled on CUDA) and the torch
backend vs the plain reference (whole-matrix and tiled kernels up to M = 256; the unrolled and the
implicit backward, both through the custom operator), the range of the first iterate's scale,
reference semantics and exact gradients, convergence and its report, dispatch and input
validation. Ahead-of-time compilation: test_aot.py."""
import math
from typing import NamedTuple, Optional

import pytest
import torch

from mmeffattn.ops import (laplacian_kernel_naive, newton_schulz_pinv,
                           newton_schulz_pinv_naive, newton_schulz_residual)
from mmeffattn.ops.newton_schulz import BACKWARDS
from op_checks import DEVICE, DTYPES, assert_close, needs_triton

pytestmark = pytest.mark.usefixtures('one_thread')
DTYPES = dict(DTYPES, fp64=torch.float64)
EPS = 0.01  # LaplacianFormer's regularization


def kernel_matrix(B: int, H: int, M: int, lam: float = 32.0, seed: int = 0) -> torch.Tensor:
    """``[B, H, M, M]`` fp64: the Laplacian kernel of M random 16-d landmarks, i.e. the matrix
    LaplacianFormer inverts (symmetric positive definite, positive entries). lam = 32 gives
    condition numbers ~80 at M = 24."""
    g = torch.Generator().manual_seed(seed)
    pts = torch.randn(B, H, M, 16, generator=g, dtype=torch.float64)
    return laplacian_kernel_naive(pts, pts, lam)


def eye_like(a: torch.Tensor) -> torch.Tensor:
    return torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)


class Case(NamedTuple):
    B: int
    H: int
    M: int
    iters: int
    dtype: str
    path: Optional[str] = None  # 'tiled': force the multi-program kernels (fwd and bwd)

    @property
    def id(self) -> str:
        return (f'B{self.B}-H{self.H}-M{self.M}-it{self.iters}-{self.dtype}'
                + (f'-{self.path}' if self.path else ''))


@pytest.fixture
def force_path(monkeypatch):
    """``force_path(case)`` makes the launchers take the case's path on small matrices."""
    from mmeffattn.ops.newton_schulz import function

    def apply(case: Case) -> None:
        if case.path == 'tiled':
            monkeypatch.setattr(function, 'MAX_REGISTER_MP', {'fwd': 0, 'bwd': 0})
    return apply


def check_against_reference(case: Case, backend: str, device: str = DEVICE,
                            backward: str = 'unrolled') -> None:
    """Forward and gradient (same upstream gradient) vs the reference in float64; the Triton
    backend's gradient comes from the custom operator."""
    dtype = DTYPES[case.dtype]
    a = kernel_matrix(case.B, case.H, case.M).to(device, dtype).requires_grad_()
    out = newton_schulz_pinv(a, case.iters, EPS, backward=backward, check=False, backend=backend)
    assert out.dtype == dtype and out.shape == a.shape
    if backend == 'triton':
        assert 'newton_schulz_pinv' in out.grad_fn.name(), out.grad_fn.name()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out.backward(g)
    a64 = a.detach().double().requires_grad_()
    ref = newton_schulz_pinv_naive(a64, case.iters, EPS, implicit=backward == 'implicit')
    ref.backward(g.double())
    assert_close(out, ref, dtype, 'out')
    assert_close(a.grad, a64.grad, dtype, 'da')


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
# M = 1 and 13 (padded to 16), 40 (padded to 64: whole-matrix forward, tiled backward), 64 and
# 128 (tiled both ways, unpadded), 200 (padded to 256, the largest: a partial last tile), small
# sizes forced through the tiled kernels, 0 iterations (V_0 = alpha P only), every dtype the
# kernels take. (An interpreted program at MP = 256 takes about half a second: few steps.)
TRITON_CASES = [
    Case(1, 2, 13, 6, 'fp32'),
    Case(1, 2, 13, 6, 'fp16'),
    Case(1, 2, 13, 6, 'bf16'),
    Case(2, 1, 1, 4, 'fp32'),
    Case(1, 2, 13, 0, 'fp32'),
    Case(1, 1, 40, 5, 'fp32'),
    Case(1, 2, 37, 4, 'fp32', 'tiled'),
    Case(1, 1, 13, 3, 'fp16', 'tiled'),
    Case(1, 1, 64, 3, 'fp32'),
    Case(1, 1, 128, 1, 'fp32'),
    Case(1, 1, 200, 1, 'fp32'),
]


@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case, force_path) -> None:
    force_path(case)
    check_against_reference(case, backend='triton')


@needs_triton
@pytest.mark.parametrize('path', [None, 'tiled'])
def test_triton_tied_row_sums(path, force_path) -> None:
    """Several rows reach the largest row sum (alpha's max): the gradient through alpha is
    shared evenly among them, as torch's amax does, in both kernels."""
    force_path(Case(1, 1, 1, 1, 'fp32', path))
    M = 11
    base = 0.2 * torch.ones(M, M, dtype=torch.float64) + torch.eye(M, dtype=torch.float64)
    a = base.expand(1, 2, M, M).clone()  # every row sums to the same value
    a[:, 1, 3, 4] = a[:, 1, 4, 3] = 0.1  # the second matrix: two rows fall out of the tie
    a = a.float().requires_grad_()
    out = newton_schulz_pinv(a, 4, EPS, backend='triton')
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(g)
    a64 = a.detach().double().requires_grad_()
    newton_schulz_pinv_naive(a64, 4, EPS).backward(g.double())
    assert_close(out, newton_schulz_pinv_naive(a64.detach(), 4, EPS), torch.float32, 'out')
    assert_close(a.grad, a64.grad, torch.float32, 'da')


@needs_triton
def test_triton_strided_input_and_no_grad() -> None:
    """A transposed, non-contiguous input; inference stores no iterates."""
    a = kernel_matrix(2, 3, 21).float()
    at = a.transpose(0, 1)  # [3, 2, M, M] view
    with torch.no_grad():
        out = newton_schulz_pinv(at, 5, EPS, backend='triton')
    assert_close(out, newton_schulz_pinv_naive(at.double(), 5, EPS), torch.float32, 'out')
    at = at.detach().requires_grad_()
    newton_schulz_pinv(at, 5, EPS, backend='triton').sum().backward()
    at64 = at.detach().double().requires_grad_()
    newton_schulz_pinv_naive(at64, 5, EPS).sum().backward()
    assert_close(at.grad, at64.grad, torch.float32, 'da')


@needs_triton
@pytest.mark.parametrize('iters', [0, 1, 3])
def test_triton_multi_program_inference(iters: int) -> None:
    """The multi-program forward without a gradient: V_0 straight to the output (0 steps), or
    the steps ping-ponging between two slots, the last one writing the output."""
    a = kernel_matrix(1, 2, 40).float().to(DEVICE)
    with torch.no_grad():
        out = newton_schulz_pinv(a, iters, EPS, check=False, backend='triton')
    assert_close(out, newton_schulz_pinv_naive(a.double(), iters, EPS), torch.float32, 'out')


#: largest row sums s of the first iterate's scale 1.8 / s^2, each side of both ends of the range
#: where s^2 stays in fp32 (about 1e-18 .. 1e18)
EXTREME_ROW_SUMS = [5e-19, 2e-18, 5e17, 2e18]


@pytest.mark.parametrize('backend', [pytest.param('triton', marks=needs_triton), 'torch'])
@pytest.mark.parametrize('path', [None, 'tiled'])
@pytest.mark.parametrize('s', EXTREME_ROW_SUMS, ids=lambda s: f's{s:g}')
def test_extreme_scales(s: float, path, backend: str, force_path) -> None:
    """fp32 matrices whose largest row sum is near 1e-18 or 1e18: forward and unrolled gradient
    equal the plain formula's evaluated in fp64 (where 1.8 / s^2 is in range). Both backends
    apply alpha as ``(1 / s) (1.8 / s)``, forward and backward: the backward's
    ``d alpha / ds = -2 alpha / s`` left fp32 as written (inf at 2e-18, 0 at 5e17). The
    upstream gradient scales with s, so that the input's gradient (about 1 / s) is in range."""
    if path and backend != 'triton':
        pytest.skip('the tiled kernels are a Triton path')
    force_path(Case(1, 1, 1, 1, 'fp32', path))
    k = kernel_matrix(1, 2, 6, lam=8.0)
    a = (k * (s / k.sum(-1).amax())).float().requires_grad_()
    out = newton_schulz_pinv(a, 3, 0.0, check=False, backend=backend)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward((g * s).float())
    a64 = a.detach().double().requires_grad_()
    ref = newton_schulz_pinv_naive(a64, 3, 0.0)
    ref.backward(g * s)
    assert_close(out, ref, torch.float32, 'out')
    assert_close(a.grad, a64.grad, torch.float32, 'da')


@needs_triton
def test_larger_matrices_run_the_torch_backend(monkeypatch) -> None:
    """Past M = 256 the kernels are not used: the automatic choice runs the torch backend, an
    explicit Triton request names the reason."""
    from mmeffattn.ops.newton_schulz import op
    monkeypatch.delenv('MMEFFATTN_OPS_BACKEND', raising=False)
    a = torch.eye(257)[None, None].to(DEVICE)
    assert any('matrix side 257 > 256' in r for r in op.newton_schulz_triton_reasons(a))
    assert not any('matrix side' in r for r in op.newton_schulz_triton_reasons(a[..., 1:, 1:]))
    with pytest.raises(RuntimeError, match='matrix side 257 > 256'):
        newton_schulz_pinv(a, 1, EPS, backend='triton')
    calls = []
    monkeypatch.setattr(op, 'newton_schulz_pinv_torch',
                        lambda *args: calls.append('torch') or args[0].clone())
    newton_schulz_pinv(a, 1, EPS, check=False)
    assert calls == ['torch']


@needs_triton
def test_operator_opcheck_implicit() -> None:
    """``torch.library.opcheck`` of the operator with ``implicit=True`` (the unrolled one is in
    test_library.py): schema, fake implementation, the autograd registration's backward."""
    from mmeffattn.ops.newton_schulz import library  # noqa: F401 (registers the operator)
    a = kernel_matrix(1, 2, 5).float().to(DEVICE)
    for x in (a, a.clone().requires_grad_()):
        torch.library.opcheck(torch.ops.mmeffattn.newton_schulz_pinv, (x, 3, EPS, True, True))


@pytest.mark.parametrize('M, per_matrix', [(13, 1), (32, 1), (33, 4), (49, 4), (100, 8),
                                           (200, 16)])
def test_programs_per_matrix(M: int, per_matrix: int) -> None:
    """Past M = 32 every launch spreads each matrix over several programs (row blocks), so more
    than B * heads SMs work; forward 1 + iters launches, backward 2 iters + 1."""
    pytest.importorskip('triton')
    from mmeffattn.ops._launch import record_launches
    from mmeffattn.ops.newton_schulz import function
    B, H, iters = 2, 3, 4
    a = torch.empty(B, H, M, M)
    with record_launches() as launches:
        out, ws = function.newton_schulz_fwd(a, iters, EPS, True)
        n_fwd = len(launches)
        function.newton_schulz_bwd(torch.empty_like(out), a, ws, iters, EPS)
    assert (n_fwd, len(launches) - n_fwd) == ((1, 1) if per_matrix == 1 else
                                              (1 + iters, 2 * iters + 1))
    for launch in launches:
        assert math.prod(launch.grid) == B * H * per_matrix, (launch.role, launch.grid)
        if 'INPUT_PRECISION' in launch.config.constexprs:
            assert launch.config.constexprs['INPUT_PRECISION'] == 'tf32x3'


_PTX_SCRIPT = """
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mmeffattn.analysis.kernels import specialise
from mmeffattn.ops._launch import record_launches
from mmeffattn.ops.newton_schulz import function
a = torch.empty(1, 2, int(sys.argv[1]), int(sys.argv[1]))
with record_launches() as launches:
    out, ws = function.newton_schulz_fwd(a, 2, 0.01, True)
    function.newton_schulz_bwd(torch.empty_like(out), a, ws, 2, 0.01)
seen = set()
for launch in launches:
    if launch.role not in ('fwd', 'bwd') or launch.role in seen:
        continue
    seen.add(launch.role)
    target, sig, constexprs, attrs, options = specialise(launch, int(sys.argv[2]))
    c = triton.compile(ASTSource(launch.config.kernel, sig, constexprs, attrs), target=target,
                       options=options.__dict__)
    print(launch.config.kernel.__name__, c.asm['ptx'].count('mma.sync'),
          c.asm['ptx'].count('wgmma.mma_async'))
"""


@pytest.mark.parametrize('M, arch', [(13, 90), (49, 80)])
def test_compiled_kernels_use_tensor_cores(M: int, arch: int) -> None:
    """Compiled ahead of time (interpreter off), the step kernels' 'tf32x3' products are
    tensor-core instructions (``mma.sync`` / ``wgmma`` in the PTX), not fp32 FMA loops."""
    pytest.importorskip('triton')
    import os
    import subprocess
    import sys
    from op_checks import ROOT
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, '-c', _PTX_SCRIPT, str(M), str(arch)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = [line.split() for line in res.stdout.splitlines()]
    assert len(counts) == 2, res.stdout
    for name, mma, wgmma in counts:
        assert int(mma) + int(wgmma) > 0, f'{name}: no tensor-core instruction in the PTX'


# ------------------------------------------------------------------------------------------
# the reference alone: semantics, gradient, convergence
# ------------------------------------------------------------------------------------------
def test_reference_is_the_official_iteration() -> None:
    """The official CUDA operator: P = a + 0.01 I, alpha = 1.8 / (max row sum of P)^2,
    V = alpha P, then V <- 2V - V P V. Written out per matrix with explicit Python loops."""
    a = kernel_matrix(2, 2, 7, lam=8.0)
    ours = newton_schulz_pinv(a, 5, 0.01, backend='reference')
    for b in range(2):
        for h in range(2):
            p = a[b, h] + 0.01 * torch.eye(7, dtype=torch.float64)
            s = max(float(p[i].sum()) for i in range(7))
            v = 1.8 / s ** 2 * p
            for _ in range(5):
                v = 2 * v - v @ p @ v
            assert_close(ours[b, h], v, torch.float64, f'matrix {b},{h}')
    assert_close(newton_schulz_pinv(a, 0, 0.01, backend='reference'),
                 1.8 / (a + 0.01 * eye_like(a)).sum(-1).amax(-1)[..., None, None] ** 2
                 * (a + 0.01 * eye_like(a)), torch.float64, 'iters=0')


@pytest.mark.parametrize('iters', [0, 3])
def test_reference_gradcheck_fp64(iters: int) -> None:
    """alpha is differentiated (not detached): the gradient is that of the returned iterate,
    unconverged (3 steps) or not iterated at all."""
    a = kernel_matrix(1, 2, 6, lam=8.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: newton_schulz_pinv_naive(a, iters, EPS), (a,),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('backend, M, dtype', [
    pytest.param('triton', 13, 'fp32', marks=needs_triton),
    pytest.param('triton', 40, 'fp16', marks=needs_triton),
    pytest.param('triton', 200, 'fp32', marks=needs_triton),
    ('torch', 13, 'fp32'), ('torch', 13, 'bf16'),
    ('reference', 13, 'fp32'), ('reference', 13, 'bf16')], ids=lambda x: str(x))
def test_implicit_backward_is_the_official_one(backend: str, M: int, dtype: str) -> None:
    """backward='implicit': the same forward as 'unrolled', and dL/da = -V^T G V^T from the
    result V, as the official CUDA operator's backward (Triton: the custom operator's); only V
    is kept for it (one ``[B, heads, M, M]`` storage, saved once or twice)."""
    dt = DTYPES[dtype]
    H, iters = (1, 1) if M > 128 else (2, 4)  # (an interpreted MP = 256 program is slow)
    a = kernel_matrix(1, H, M).to(DEVICE, dt).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = newton_schulz_pinv(a, iters, EPS, backward='implicit', check=False,
                                 backend=backend)
    assert len({t.data_ptr() for t in saved}) == 1 and saved[0].shape[-2:] == a.shape[-2:]
    assert saved[0].numel() == a.numel()
    if backend == 'triton':
        assert 'newton_schulz_pinv' in out.grad_fn.name(), out.grad_fn.name()
    assert torch.equal(out, newton_schulz_pinv(a.detach(), iters, EPS, check=False,
                                               backend=backend))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dt)
    out.backward(g)
    vt = out.detach().double().transpose(-1, -2)
    assert a.grad.dtype == dt
    assert_close(a.grad, -(vt @ g.double() @ vt), dt, 'da')


def test_implicit_and_unrolled_agree_once_converged() -> None:
    """In fp64: converged (30 steps, condition number ~80), both gradients are the gradient of
    torch.linalg.inv; 3 steps in, only 'unrolled' is the derivative of what is returned and the
    two differ."""
    a = kernel_matrix(1, 2, 24)
    g = torch.randn(a.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def grad(fn):
        x = a.clone().requires_grad_()
        fn(x).backward(g)
        return x.grad

    exact = grad(lambda x: torch.linalg.inv(x + EPS * eye_like(x)))
    for backward in ('unrolled', 'implicit'):
        got = grad(lambda x: newton_schulz_pinv(x, 30, EPS, backward=backward))
        assert_close(got, exact, torch.float64, backward)
    early = [grad(lambda x: newton_schulz_pinv(x, 3, EPS, backward=backward, check=False))
             for backward in ('unrolled', 'implicit')]
    assert (early[0] - early[1]).norm() > 0.1 * early[0].norm()


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_reference_low_precision(dtype: str) -> None:
    check_against_reference(Case(1, 2, 13, 6, dtype), backend='reference', device='cpu')


def _residual_bounds_hold(a: torch.Tensor, v: torch.Tensor, eps: float,
                          reported: torch.Tensor) -> None:
    """The reported residual r is the genuine ``||P V - I||_F / sqrt(M)``: recomputed
    independently, and consistent with the true error ``E = V - P^{-1}`` through
    ``||P V - I|| = ||P E|| <= ||P||_2 ||E||_F`` and ``||E||_F <= ||P^{-1}||_2 ||P V - I||_F``
    (a report that hides non-convergence breaks the first, one that invents it the second)."""
    p = a.double() + eps * eye_like(a.double())
    inv = torch.linalg.inv(p)
    M = a.shape[-1]
    res_f = (torch.einsum('...ij,...jk->...ik', p, v.double()) - eye_like(p)).pow(2) \
        .sum((-1, -2)).sqrt()
    assert torch.allclose(reported * math.sqrt(M), res_f, rtol=1e-9, atol=1e-12)
    err_f = torch.linalg.matrix_norm(v.double() - inv)
    assert (res_f <= torch.linalg.matrix_norm(p, 2) * err_f * (1 + 1e-9) + 1e-12).all()
    assert (err_f <= torch.linalg.matrix_norm(inv, 2) * res_f * (1 + 1e-9) + 1e-12).all()


@pytest.mark.parametrize('backend', [pytest.param('triton', marks=needs_triton), 'reference'])
def test_converges_on_well_conditioned_spd(backend: str) -> None:
    """A Laplacian kernel matrix of 24 landmarks (condition numbers 68 and 78 with eps): 20
    fp32 iterations reach the inverse (measured: residual ||P V - I||_F / sqrt(M) 3-6e-6,
    relative error to torch.linalg.inv ~5e-7, both backends); 10 are not enough and the
    residual says so (~0.4)."""
    a = kernel_matrix(1, 2, 24).float().to(DEVICE)
    p = a.double().cpu() + EPS * eye_like(a.double().cpu())
    cond = torch.linalg.cond(p)
    assert (cond > 50).all() and (cond < 150).all()
    inv = torch.linalg.inv(p)
    v = newton_schulz_pinv(a, 20, EPS, backend=backend).cpu()
    res = newton_schulz_residual(a.cpu(), v, EPS)
    _residual_bounds_hold(a.cpu(), v, EPS, res)
    assert (res < 3e-5).all(), res
    rel = torch.linalg.matrix_norm(v.double() - inv) / torch.linalg.matrix_norm(inv)
    assert (rel < 5e-6).all(), rel
    v10 = newton_schulz_pinv(a, 10, EPS, backend=backend).cpu()
    res10 = newton_schulz_residual(a.cpu(), v10, EPS)
    _residual_bounds_hold(a.cpu(), v10, EPS, res10)
    assert (res10 > 0.1).all(), res10


def ill_conditioned(M: int = 16) -> torch.Tensor:
    """``[1, 1, M, M]`` fp64, SPD with positive entries, condition number ~7.6e5: ones / M
    plus a diagonal spread over 1e-6 .. 1."""
    d = torch.logspace(-6, 0, M, dtype=torch.float64)
    return (torch.ones(M, M, dtype=torch.float64) / M + torch.diag(d))[None, None]


def test_ill_conditioned_reference_reports_convergence_truthfully() -> None:
    """Condition number ~7.6e5 (eps = 0): the smallest eigenvalue's component starts ~1e-12
    below 1 and only doubles per step, so 20 steps leave the residual at ~0.65 (relative error
    ~1, not converged, reported as such); 60 steps in float64 converge (measured residual
    ~6e-8, relative error ~1e-12)."""
    a = ill_conditioned()
    cond = torch.linalg.cond(a).item()
    assert 5e5 < cond < 1e6
    inv = torch.linalg.inv(a)
    v20 = newton_schulz_pinv(a, 20, 0.0, backend='reference')
    r20 = newton_schulz_residual(a, v20, 0.0)
    _residual_bounds_hold(a, v20, 0.0, r20)
    assert r20.item() > 0.5
    assert (torch.linalg.matrix_norm(v20 - inv) / torch.linalg.matrix_norm(inv)).item() > 0.5
    v60 = newton_schulz_pinv(a, 60, 0.0, backend='reference')
    r60 = newton_schulz_residual(a, v60, 0.0)
    _residual_bounds_hold(a, v60, 0.0, r60)
    assert r60.item() < 1e-6
    assert (torch.linalg.matrix_norm(v60 - inv) / torch.linalg.matrix_norm(inv)).item() < 1e-9


@needs_triton
def test_ill_conditioned_triton_fp32_reports_non_convergence() -> None:
    """The same matrix in fp32 through the kernels: after 20 steps the residual matches the
    float64 reference's (~0.65); after 60 the fp32 iteration stalls at a residual ~22 (its
    relative error ~7e-4; the exact inverse rounded to fp32 has residual ~7e-4), so the report
    says "not converged" and the bounds confirm it is the true residual; the op's own check
    then raises (``check=False`` returns the iterate)."""
    a = ill_conditioned().float()
    v20 = newton_schulz_pinv(a.to(DEVICE), 20, 0.0, backend='triton').cpu()
    r20 = newton_schulz_residual(a, v20, 0.0)
    _residual_bounds_hold(a, v20, 0.0, r20)
    r20_ref = newton_schulz_residual(a, newton_schulz_pinv_naive(a.double(), 20, 0.0), 0.0)
    assert abs(r20.item() - r20_ref.item()) < 1e-3 * r20_ref.item()
    v60 = newton_schulz_pinv(a.to(DEVICE), 60, 0.0, check=False, backend='triton').cpu()
    r60 = newton_schulz_residual(a, v60, 0.0)
    _residual_bounds_hold(a, v60, 0.0, r60)
    assert r60.item() > 1.0
    with pytest.raises(ValueError, match=r'1 of the 1 matrices did not converge.*iters=60'):
        newton_schulz_pinv(a.to(DEVICE), 60, 0.0, check=True, backend='triton')


# ------------------------------------------------------------------------------------------
# outputs, fake and meta tensors, autocast
# ------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize('M, dtype', [(5, 'fp32'), (16, 'fp32'), (16, 'fp16'), (40, 'fp32'),
                                      (64, 'fp32')],
                         ids=['pad-fp32', 'exact-fp32', 'exact-fp16', 'pad-tiled', 'exact-tiled'])
def test_triton_results_are_new_tensors(M: int, dtype: str) -> None:
    """The launchers' result and gradient are new contiguous ``[B, heads, M, M]`` tensors, not
    views of the padded fp32 ``[B*heads, MP, MP]`` buffers the kernels write, whether M is
    padded or not (M = MP in fp32 is the buffer itself, allocated with the result's shape),
    with the whole-matrix and the tiled kernels; so the public op's result can be modified in
    place after a call that needs a gradient, as the reference's."""
    from mmeffattn.ops.newton_schulz import function
    a = kernel_matrix(1, 2, M).to(DEVICE, DTYPES[dtype])
    out, ws = function.newton_schulz_fwd(a, 3, EPS, True)
    da = function.newton_schulz_bwd(torch.ones_like(out), a, ws, 3, EPS)
    for name, t in (('out', out), ('da', da)):
        assert t._base is None and t.is_contiguous(), name
        assert (t.shape, t.dtype) == (a.shape, a.dtype), name
    x = a.clone().requires_grad_()
    inv = newton_schulz_pinv(x, 3, EPS, check=False, backend='triton')
    assert inv._base is None and inv.is_contiguous()
    inv.mul_(2)  # an operator output that is a view refused this
    inv.sum().backward()
    ref = newton_schulz_pinv(a, 3, EPS, check=False, backend='reference')
    torch.testing.assert_close(inv.detach(), 2 * ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize('backend', [pytest.param('triton', marks=needs_triton), 'reference'])
def test_fake_and_meta_inputs(backend: str) -> None:
    """Under a FakeTensorMode and on meta tensors the default convergence check (CPU inputs,
    eagerly) is skipped, as in a captured graph: there is no value to check."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    a = kernel_matrix(1, 2, 6).float()
    with FakeTensorMode() as mode:
        out = newton_schulz_pinv(mode.from_tensor(a), 3, EPS, backend=backend)
    assert (out.shape, out.dtype) == (a.shape, a.dtype)
    if backend == 'reference':  # (the kernels do not take meta tensors)
        out = newton_schulz_pinv(a.to('meta'), 3, EPS, backend=backend)
        assert (out.shape, out.dtype, out.device.type) == (a.shape, a.dtype, 'meta')


@pytest.mark.parametrize('backend, M', [pytest.param('triton', 13, marks=needs_triton),
                                          ('torch', 13), ('torch', 300), ('reference', 13)])
def test_autocast_is_not_followed(backend: str, M: int) -> None:
    """Under autocast the fp32 iteration stays fp32 on every backend (the PyTorch ones run
    under the caller's autocast, which would run the matmuls in bf16), past the kernels' size
    too (the torch backend); the implicit backward's products as well."""
    a = kernel_matrix(1, 1, M).float().to(DEVICE)

    for backward in BACKWARDS:
        def forward():
            x = a.clone().requires_grad_()
            return x, newton_schulz_pinv(x, 4, EPS, backward=backward, check=False,
                                         backend=backend)

        def grads(x, out):
            out.backward(torch.ones_like(out))  # outside autocast, as AMP's backward
            return out.detach(), x.grad

        expected = grads(*forward())
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            x, out = forward()
        for name, g, e in zip(('out', 'da'), grads(x, out), expected):
            assert g.dtype == torch.float32, name
            torch.testing.assert_close(g, e, rtol=0, atol=0, msg=f'{backward} {name}')


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize('args, match', [
    ((_t(2, 4, 4), 3, EPS), r'a must be \[B, heads, M, M\] \(4 dims\).*a\[None\]'),
    ((_t(1, 2, 4, 5), 3, EPS), r'square matrices.*landmark-landmark'),
    ((_t(1, 2, 0, 0), 3, EPS), r'a must not be empty, got shape \(1, 2, 0, 0\)'),
    ((_t(0, 2, 3, 3), 3, EPS), r'every dim must be at least 1'),
    ((_t(1, 2, 4, 4, dtype=torch.int32), 3, EPS), r'floating point'),
    ((_t(1, 2, 4, 4), -1, EPS), r'iters must be an int >= 0.*got -1'),
    ((_t(1, 2, 4, 4), 2.5, EPS), r'iters must be an int >= 0'),
    ((_t(1, 2, 4, 4), True, EPS), r'iters must be an int >= 0'),
    ((_t(1, 2, 4, 4), 3, -0.1), r'eps must be a finite float >= 0'),
    ((_t(1, 2, 4, 4), 3, math.inf), r'eps must be a finite float >= 0'),
    ((_t(1, 2, 4, 4), 3, None), r'eps must be a finite float >= 0'),
    (([[1.0]], 3, EPS), r'a must be a torch.Tensor'),
])
def test_invalid_inputs(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        newton_schulz_pinv(*args)


def test_invalid_backward() -> None:
    with pytest.raises(ValueError, match=r"backward must be one of \('unrolled', 'implicit'\), "
                                         r"got 'exact'"):
        newton_schulz_pinv(_t(1, 2, 4, 4), 3, EPS, backward='exact')


def test_public_api() -> None:
    import mmeffattn.ops as ops
    for name in ('newton_schulz_pinv', 'newton_schulz_pinv_naive', 'newton_schulz_residual'):
        assert name in ops.__all__ and getattr(ops, name) is globals()[name]
