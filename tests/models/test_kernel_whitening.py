"""KernelWhitening against an independent fp64 re-computation of LaplacianFormer's feature map."""
import pytest
import torch

from mmeffattn.models.layers.kernel_whitening import KernelWhitening

pytestmark = pytest.mark.usefixtures('one_thread')


def laplacian_similarities(q: torch.Tensor, landmarks: torch.Tensor, lam: float) -> torch.Tensor:
    """``s[b, h, i, m] = exp(-sum_d |q[b, h, i, d] - l[b, h, m, d]| / lam)``, by explicit sums."""
    B, H, N, D = q.shape
    M = landmarks.shape[2]
    s = torch.empty(B, H, N, M, dtype=torch.float64)
    for m in range(M):
        dist = (q - landmarks[:, :, m:m + 1, :]).abs().sum(-1)  # [B, H, N]
        s[..., m] = torch.exp(-dist / lam)
    return s


def paper_map(s: torch.Tensor, bias: torch.Tensor, eps: float, per_slot: bool) -> torch.Tensor:
    """``z_i = Sigma^{-1/2} (s_i - mu) + beta`` with mu, diagonal Sigma over batch and tokens."""
    dims = (0, 2) if per_slot else (0, 2, 3)
    mu = s.mean(dim=dims, keepdim=True)
    var = ((s - mu) ** 2).mean(dim=dims, keepdim=True)  # biased: the batch's own variance
    beta = bias.view(1, bias.shape[0], 1, bias.shape[1])
    return (s - mu) / torch.sqrt(var + eps) + beta


def _inputs(B=2, H=3, N=37, M=5, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    landmarks = torch.randn(B, H, M, D, generator=g, dtype=torch.float64) * 0.5
    return laplacian_similarities(q, landmarks, lam=4.), g


@pytest.mark.parametrize('per_slot', [True, False], ids=['per-slot', 'per-head'])
def test_training_matches_paper_formula_fp64(per_slot):
    s, g = _inputs()
    H, M = s.shape[1], s.shape[3]
    wh = KernelWhitening(H, M if per_slot else None, eps=1e-5).double().train()
    with torch.no_grad():
        wh.bias.copy_(torch.randn(wh.bias.shape, generator=g, dtype=torch.float64))
    out = wh(s)
    ref = paper_map(s, wh.bias.detach(), 1e-5, per_slot)
    assert out.shape == s.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    # whitened: zero mean and unit variance per statistic (before the bias)
    dims = (0, 2) if per_slot else (0, 2, 3)
    centred = out - wh.bias.detach().view(1, H, 1, -1)
    assert centred.mean(dim=dims).abs().max() < 1e-10
    var_s = s.var(dim=dims, unbiased=False)
    torch.testing.assert_close(centred.var(dim=dims, unbiased=False), var_s / (var_s + 1e-5))


def test_running_statistics_and_eval_use_them():
    s, _ = _inputs()
    H, M = s.shape[1], s.shape[3]
    wh = KernelWhitening(H, M, momentum=0.1).double().train()
    wh(s)
    n = s.shape[0] * s.shape[2]
    mu = s.mean(dim=(0, 2))  # [H, M]
    var_unbiased = s.var(dim=(0, 2), unbiased=True)
    torch.testing.assert_close(wh.running_mean, 0.1 * mu, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(wh.running_var, 0.9 + 0.1 * var_unbiased, rtol=1e-10, atol=1e-12)
    assert n > 2
    wh.eval()
    z = wh(s)
    ref = (s - wh.running_mean[None, :, None]) / torch.sqrt(wh.running_var[None, :, None] + wh.eps)
    torch.testing.assert_close(z, ref, rtol=1e-10, atol=1e-10)
    # the map is an invertible affine map of each similarity vector (hence injective)
    back = (z - wh.bias[None, :, None]) * torch.sqrt(wh.running_var[None, :, None] + wh.eps) \
        + wh.running_mean[None, :, None]
    torch.testing.assert_close(back, s, rtol=1e-10, atol=1e-12)


def test_update_stats_false_leaves_running_estimates():
    s, _ = _inputs()
    wh = KernelWhitening(s.shape[1], s.shape[3]).double().train()
    out_a = wh(s, update_stats=False)
    assert torch.equal(wh.running_mean, torch.zeros_like(wh.running_mean))
    assert torch.equal(wh.running_var, torch.ones_like(wh.running_var))
    torch.testing.assert_close(out_a, wh(s))  # same batch statistics either way


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16],
                         ids=['fp32', 'bf16', 'fp16'])
def test_gradients_finite_and_fp32_for_16bit(dtype):
    s, _ = _inputs()
    x = s.to(dtype).requires_grad_(True)
    wh = KernelWhitening(s.shape[1], s.shape[3]).train()
    out = wh(x)
    assert out.dtype == (torch.float32 if dtype != torch.float32 else dtype)
    assert wh.running_mean.dtype == torch.float32
    g = torch.Generator().manual_seed(1)
    out.backward(torch.randn(out.shape, generator=g))
    assert torch.isfinite(out).all() and torch.isfinite(x.grad.float()).all()
    assert torch.isfinite(wh.bias.grad).all() and wh.bias.grad.abs().sum() > 0


def test_bad_inputs_raise_clear_errors():
    wh = KernelWhitening(3, 5)
    with pytest.raises(ValueError, match=r'\[B, 3, N, M\]'):
        wh(torch.randn(2, 4, 7, 5))
    with pytest.raises(ValueError, match='num_landmarks=None'):
        wh(torch.randn(2, 3, 7, 6))
    with pytest.raises(ValueError, match='at least 2 samples'):
        wh(torch.randn(1, 3, 1, 5))
    with pytest.raises(ValueError, match='num_heads'):
        KernelWhitening(0)
    with pytest.raises(ValueError, match='eps'):
        KernelWhitening(2, eps=0.)
    # per-head statistics accept any landmark count
    out = KernelWhitening(3, None)(torch.randn(2, 3, 7, 6))
    assert out.shape == (2, 3, 7, 6)


def test_whitened_nystrom_product_matches_the_derivation_fp64():
    """docs/design/laplacian_whitening.md: Out = [(K(Q,L) - 1 mu^T) D + 1 beta^T] W^-1 K(L,K) V / N,
    here with the CG solve of W X = K(L, K) V."""
    from mmeffattn.models.layers.linear_solve import conjugate_gradient_solve
    g = torch.Generator().manual_seed(4)
    B, H, N, M, D, eps = 2, 2, 30, 6, 4, 0.01
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    landmarks = q.reshape(B, H, M, N // M, D).mean(3)  # pooled queries, as the backbone's
    k_ql = laplacian_similarities(q, landmarks, lam=4.)  # [B, H, N, M]; keys = queries
    k_ll = laplacian_similarities(landmarks, landmarks, lam=4.)
    v = torch.randn(B, H, N, 3, generator=g, dtype=torch.float64)
    wh = KernelWhitening(H, M).double().train()
    with torch.no_grad():
        wh.bias.copy_(torch.randn(H, M, generator=g, dtype=torch.float64))
    x = conjugate_gradient_solve(k_ll, k_ql.transpose(-2, -1) @ v, eps, iters=50, tol=1e-13)
    out = wh(k_ql) @ x / N
    mu = k_ql.mean(dim=(0, 2), keepdim=True)
    d = 1 / torch.sqrt(k_ql.var(dim=(0, 2), unbiased=False, keepdim=True) + wh.eps)
    core = torch.linalg.inv(k_ll + eps * torch.eye(M, dtype=torch.float64))
    ref = ((k_ql - mu) * d + wh.bias.detach()[None, :, None]) @ core \
        @ k_ql.transpose(-2, -1) @ v / N
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
