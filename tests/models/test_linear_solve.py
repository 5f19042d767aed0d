"""Conjugate-gradient solve against torch.linalg.solve, and its gradients."""
import pytest
import torch

from mmeffattn.models.layers.linear_solve import cg_iterations, conjugate_gradient_solve

pytestmark = pytest.mark.usefixtures('one_thread')


def laplacian_gram(points: torch.Tensor, lam: float = 4.) -> torch.Tensor:
    """``exp(-||x_m - x_n||_1 / lam)`` for ``points [..., M, D]``: SPD for distinct points."""
    return torch.exp(-(points[..., :, None, :] - points[..., None, :, :]).abs().sum(-1) / lam)


def _system(shape=(2, 3), M=13, K=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = laplacian_gram(torch.randn(*shape, M, 6, generator=g, dtype=dtype) * 2)
    b = torch.randn(*shape, M, K, generator=g, dtype=dtype)
    return a, b


@pytest.mark.parametrize('backward', ['implicit', 'unrolled'])
@pytest.mark.parametrize('eps', [0., 0.01], ids=['eps0', 'eps0.01'])
def test_matches_linalg_solve_on_a_well_conditioned_system(eps, backward):
    a, b = _system()
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    assert torch.linalg.cond(a + eps * eye).max() < 100  # well conditioned: CG converges fast
    x = conjugate_gradient_solve(a, b, eps, iters=50, tol=1e-12, backward=backward)
    ref = torch.linalg.solve(a + eps * eye, b)
    torch.testing.assert_close(x, ref, rtol=1e-9, atol=1e-10)


def test_fp32_and_16bit_inputs():
    a, b = _system(dtype=torch.float32)
    ref = torch.linalg.solve(a.double(), b.double())
    x = conjugate_gradient_solve(a, b, iters=50, tol=1e-7)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.double(), ref, rtol=1e-4, atol=1e-4)
    xb = conjugate_gradient_solve(a.bfloat16(), b.bfloat16(), iters=50, tol=1e-7)
    assert xb.dtype == torch.bfloat16  # solved in fp32, rounded once at the end
    torch.testing.assert_close(xb.double(), ref, rtol=2e-2, atol=2e-2)


def test_fixed_iteration_count_and_tolerance():
    a, b = _system(M=24, K=3)
    full = cg_iterations(a, b, iters=200, tol=0.)
    assert full == 200  # tol 0 runs every iteration
    early = cg_iterations(a, b, iters=200, tol=1e-8)
    assert 1 <= early < 200
    x1 = conjugate_gradient_solve(a, b, iters=1, tol=0.)
    x_many = conjugate_gradient_solve(a, b, iters=early, tol=1e-8)
    ref = torch.linalg.solve(a, b)
    assert (x1 - ref).norm() > 10 * (x_many - ref).norm()  # more iterations, closer
    # a zero right-hand side is solved by zero at once
    assert cg_iterations(a, torch.zeros_like(b), iters=10) == 1
    assert torch.equal(conjugate_gradient_solve(a, torch.zeros_like(b)), torch.zeros_like(b))


@pytest.mark.parametrize('backward', ['implicit', 'unrolled'])
def test_gradcheck_fp64_tiny(backward):
    g = torch.Generator().manual_seed(3)
    pts = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)

    def f(pts, b):
        # build a symmetric A inside the function: gradcheck's one-entry perturbations of a
        # raw A would make it non-symmetric, outside CG's domain
        return conjugate_gradient_solve(laplacian_gram(pts), b, 0.01, iters=40, tol=1e-14,
                                        backward=backward)

    assert torch.autograd.gradcheck(f, (pts, b), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_match_linalg_solve_fp32():
    a, b = _system(dtype=torch.float32, M=9, K=4)
    a1, b1 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    a2, b2 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    g = torch.randn(b.shape, generator=torch.Generator().manual_seed(5))
    (conjugate_gradient_solve(a1, b1, 0.01, iters=60, tol=1e-7) * g).sum().backward()
    (torch.linalg.solve(a2 + 0.01 * torch.eye(9), b2) * g).sum().backward()
    assert torch.isfinite(a1.grad).all() and torch.isfinite(b1.grad).all()
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-3, atol=1e-4)


def test_bad_inputs_raise_clear_errors():
    a, b = _system()
    with pytest.raises(ValueError, match='square'):
        conjugate_gradient_solve(a[..., :-1], b)
    with pytest.raises(ValueError, match=r'b\[\.\.\., None\]'):
        conjugate_gradient_solve(a, b[..., 0])
    with pytest.raises(ValueError, match='iters'):
        conjugate_gradient_solve(a, b, iters=0)
    with pytest.raises(ValueError, match='eps'):
        conjugate_gradient_solve(a, b, -1.)
    with pytest.raises(ValueError, match='backward'):
        conjugate_gradient_solve(a, b, backward='adjoint')
