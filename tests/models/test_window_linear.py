"""Windowed linear attention against a dense masked re-computation on odd grids."""
import pytest
import torch
import torch.nn.functional as F

from mmeffattn.models.layers.window_linear import window_linear_attention

pytestmark = pytest.mark.usefixtures('one_thread')


def dense_reference(q, k, v, hw, window_size, with_mean, feature_map='elu', eps=1e-6):
    """Every query against every key, masked to its own window (token-wise window ids)."""
    H, W = hw
    wh, ww = min(window_size, H), min(window_size, W)
    rows = torch.arange(H).repeat_interleave(W)
    cols = torch.arange(W).repeat(H)
    win_id = (rows // wh) * 10_000 + cols // ww  # [N]
    same = (win_id[:, None] == win_id[None, :]).to(q.dtype)  # [N, N]
    phi = (lambda x: F.elu(x) + 1) if feature_map == 'elu' else F.relu
    fq, fk = phi(q), phi(k)
    w = (fq @ fk.transpose(-2, -1)) * same  # [B, h, N, N]
    n = same.sum(-1, keepdim=True)  # real tokens in each query's window
    out = (w @ v / n) / (w.sum(-1, keepdim=True) / n + eps)
    if with_mean:
        out = out + v.mean(dim=2, keepdim=True)
    return out


CASES = [  # (H, W, window): partial windows, a side shorter than the window, exact tiling
    (9, 11, 4), (5, 3, 7), (7, 14, 7), (1, 6, 3)]


@pytest.mark.parametrize('with_mean', [True, False], ids=['mean', 'nomean'])
@pytest.mark.parametrize('H,W,ws', CASES, ids=[f'H{h}-W{w}-ws{s}' for h, w, s in CASES])
def test_matches_dense_masked_fp64(H, W, ws, with_mean):
    g = torch.Generator().manual_seed(H * 100 + W)
    q, k = (torch.randn(2, 3, H * W, 5, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, H * W, 4, generator=g, dtype=torch.float64)
    out = window_linear_attention(q, k, v, (H, W), ws, with_mean=with_mean)
    ref = dense_reference(q, k, v, (H, W), ws, with_mean)
    assert out.shape == v.shape
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_relu_feature_map_and_strided_inputs():
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(2, 2, 3, 35, 6, generator=g, dtype=torch.float64)  # [B, 2, h, N, D]
    q, k = qk.unbind(1)  # non-contiguous views
    v = torch.randn(2, 35, 3, 6, generator=g, dtype=torch.float64).transpose(1, 2)
    out = window_linear_attention(q, k, v, (5, 7), 3, feature_map='relu')
    ref = dense_reference(q, k, v, (5, 7), 3, True, feature_map='relu')
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


def test_switches_change_the_computation():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 63, 8, generator=g) for _ in range(3))
    base = window_linear_attention(q, k, v, (7, 9), 4)
    assert not torch.allclose(base, window_linear_attention(q, k, v, (7, 9), 4, with_mean=False))
    assert not torch.allclose(base, window_linear_attention(q, k, v, (7, 9), 3))
    # a window covering the grid is global linear attention
    whole = window_linear_attention(q, k, v, (7, 9), 9, with_mean=False)
    torch.testing.assert_close(whole, dense_reference(q, k, v, (7, 9), 100, False))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
def test_gradients_finite(dtype):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 45, 8, generator=g).to(dtype).requires_grad_(True)
               for _ in range(3))
    out = window_linear_attention(q, k, v, (5, 9), 4)
    assert out.dtype == dtype
    out.float().backward(torch.randn(out.shape, generator=g))
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad.float()).all()
        assert t.grad.abs().sum() > 0


def test_bad_inputs_raise_clear_errors():
    q = torch.randn(1, 2, 12, 4)
    with pytest.raises(ValueError, match='hw 3x5'):
        window_linear_attention(q, q, q, (3, 5), 2)
    with pytest.raises(ValueError, match=r'\.transpose\(1, 2\)'):
        window_linear_attention(q, q[:, :1], q, (3, 4), 2)
    with pytest.raises(ValueError, match='window_size'):
        window_linear_attention(q, q, q, (3, 4), 0)
    with pytest.raises(ValueError, match='feature_map'):
        window_linear_attention(q, q, q, (3, 4), 2, feature_map='softmax')
