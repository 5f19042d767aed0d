"""Tests of the LaplacianFormer backbone (mmeffattn/models/backbones/laplacianformer.py)."""
import math

import pytest
import torch
import torch.nn as nn

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.backbones import laplacianformer as lf_mod
from mmeffattn.models.backbones.laplacianformer import (DiagonalWhitening, LaplacianAttention,
                                                        LaplacianFormer, SoftmaxAttention,
                                                        gaussian_kernel, landmark_cell)
from mmeffattn.models.layers.kernel_whitening import KernelWhitening
from mmeffattn.models.layers.nystrom import nystrom_attention, pool_landmarks
from mmeffattn.registry import MODELS

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

TINY_CHANNELS = [64, 128, 320, 512]
# Published ImageNet classifiers (paper, Table 1): parameters and GMACs at 224x224.
PAPER = {'tiny': (12.1e6, 2.1e9), 'small': (25.7e6, 4.8e9)}
# A reduced arch for the mechanism tests: every code path of 'tiny' (landmark pooling at 8/4/2,
# softmax last stage, whitening, DWC) at a fraction of the time.
MINI = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 2],
            mlp_ratios=[2, 2, 2, 2], sr_ratios=[8, 4, 2, 1])
# the model before whitening='kernel' became the default (query whitening, features scaled)
OLD = dict(whitening='query', feature_scale='sqrt_head_dim')


@pytest.fixture(scope='module')
def tiny_eval():
    """One tiny model in eval mode, shared by the tests that do not modify it."""
    torch.manual_seed(0)
    return LaplacianFormer(arch='tiny').eval()


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def expected_hw(h: int, w: int, i: int):
    """Output grid of stage i: ceil(H / 4), then ceil-halving per stage."""
    h, w = -(-h // 4), -(-w // 4)
    for _ in range(i):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


def whitening_modules(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, (DiagonalWhitening, KernelWhitening))]


# ------------------------------------------------------------------------------- construction
@pytest.mark.parametrize('arch', ['tiny', 'small'])
def test_classifier_params_within_5_percent_of_paper(arch):
    with torch.device('meta'):  # counting only: skip the init work
        model = LaplacianFormer(arch=arch, out_indices=(3, ))
    classifier = n_params(model) + n_params(nn.Linear(model.num_features[-1], 1000))
    assert abs(classifier / PAPER[arch][0] - 1) < 0.05, classifier


@pytest.mark.parametrize('arch', ['tiny', pytest.param('small', marks=pytest.mark.slow)])
def test_classifier_flops_within_5_percent_of_paper(arch):
    """The in1k config measured as the README says, with the attention ops counted."""
    from os.path import abspath, dirname, join

    from tools.analysis_tools.get_flops import count

    cfg = join(dirname(dirname(dirname(abspath(__file__)))), 'configs', 'laplacianformer',
               f'laplacianformer-{arch[0]}_8xb128_in1k.py')
    r = count(cfg, (224, 224))
    assert r['what'] == 'classifier'
    assert abs(r['params'] / PAPER[arch][0] - 1) < 0.05, r['params']
    assert abs(r['flops'] / PAPER[arch][1] - 1) < 0.05, r['flops']
    # the kernel evaluations and the Newton-Schulz products are part of the figure
    assert r['ops'].get('laplacian_kernel', 0) > 0 and r['ops'].get('newton_schulz_pinv', 0) > 0


def test_arch_aliases_and_custom_dict():
    assert LaplacianFormer._parse_arch('t') == LaplacianFormer._parse_arch('TINY')
    assert LaplacianFormer._parse_arch('s')['depths'] == [3, 4, 8, 4]
    model = LaplacianFormer(arch=dict(embed_dims=[8, 16], depths=[1, 2], num_heads=[1, 2],
                                      mlp_ratios=[2, 2], sr_ratios=[2, 1]),
                            out_indices=(0, 1))
    assert model.num_features == [8, 16] and len(model.layers) == 2
    assert len(model.layers[1].blocks) == 2
    assert isinstance(model.layers[1].blocks[0].attn, SoftmaxAttention)  # the last stage
    # a dict without mlp/sr ratios takes tiny's
    essential = {k: MINI[k] for k in ('embed_dims', 'depths', 'num_heads')}
    assert LaplacianFormer._parse_arch(essential)['sr_ratios'] == [8, 4, 2, 1]


def test_invalid_arch_raises_with_valid_names():
    with pytest.raises(KeyError, match=r"Unknown arch 'huge'.*'small'.*'tiny'"):
        LaplacianFormer(arch='huge')
    with pytest.raises(ValueError, match='embed_dims'):
        LaplacianFormer(arch=dict(depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]))
    with pytest.raises(ValueError, match='one entry per stage'):
        LaplacianFormer(arch=dict(MINI, depths=[1, 1, 1]))
    with pytest.raises(ValueError, match=r"arch \['embed_dims'\] must be lists"):
        LaplacianFormer(arch=dict(MINI, embed_dims=64))
    with pytest.raises(ValueError, match='divisible'):
        LaplacianFormer(arch=dict(MINI, num_heads=[3, 2, 2, 2]))


@pytest.mark.parametrize('kwargs,match', [
    (dict(kernel='softmax'), 'kernel must be one of'),
    (dict(lam=0), 'lam must be a positive'),
    (dict(lam=-4.), 'lam must be a positive'),
    (dict(ns_iters=-1), 'ns_iters must be an integer'),
    (dict(ns_iters=2.5), 'ns_iters must be an integer'),
    (dict(ns_backward='exact'), r"ns_backward must be one of \('unrolled', 'implicit'\)"),
    (dict(eps=-0.1), 'eps must be a number'),
    (dict(out_indices=(0, 4)), 'out_indices'),
    (dict(frozen_stages=5), 'frozen_stages'),
    (dict(dwc_kernel_sizes=(9, 5)), 'dwc_kernel_sizes'),
    (dict(max_landmarks=0), 'max_landmarks must be None or an integer'),
    (dict(max_landmarks=12.5), 'max_landmarks must be None or an integer'),
    (dict(dwc_kernel_sizes=(4, 5, 3, 3)), 'dwc_kernel must be odd'),
])
def test_invalid_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LaplacianFormer(arch=MINI, **kwargs)


def test_drop_path_linear_rule():
    with torch.device('meta'):
        model = LaplacianFormer(arch='tiny', drop_path_rate=0.3)
    blocks = [b for layer in model.layers for b in layer.blocks]
    assert isinstance(blocks[0].drop_path, nn.Identity)
    rates = [b.drop_path.drop_prob for b in blocks[1:]]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(0.3)


def test_stage_layout():
    model = LaplacianFormer(arch='tiny')
    for i, layer in enumerate(model.layers):
        attn = layer.blocks[0].attn
        if i < 3:
            assert isinstance(attn, LaplacianAttention)
            assert attn.sr_ratio == [8, 4, 2][i] and attn.dwc.kernel_size == ((9, 9), (5, 5),
                                                                             (3, 3))[i]
            assert attn.head_dim == 64 and isinstance(attn.kwhiten, KernelWhitening)
            assert attn.whiten is None and attn.kwhiten.num_landmarks == 49  # 7x7 at 224
        else:
            assert isinstance(attn, SoftmaxAttention)  # SOFT's choice for the last stage
    last = LaplacianFormer(arch=MINI, softmax_last_stage=False).layers[3].blocks[0].attn
    assert isinstance(last, LaplacianAttention) and last.sr_ratio == 1


# ------------------------------------------------------------------------------- forward
@pytest.mark.parametrize('hw', [(224, 224), (33, 47)],
                         ids=lambda s: f'{s[0]}x{s[1]}')
def test_output_shapes(tiny_eval, hw):
    with torch.no_grad():
        outs = tiny_eval(torch.randn(1, 3, *hw))
    assert isinstance(outs, tuple) and len(outs) == 4
    for i, out in enumerate(outs):
        assert out.shape == (1, TINY_CHANNELS[i], *expected_hw(*hw, i))
        assert torch.isfinite(out).all()


@pytest.mark.parametrize('out_indices,expect', [((1, 3), (1, 3)), ((-1, ), (3, )), (2, (2, )),
                                                ((0, ), (0, ))])
def test_out_indices(out_indices, expect):
    model = LaplacianFormer(arch=MINI, out_indices=out_indices).eval()
    assert model.out_indices == expect
    with torch.no_grad():
        outs = model(torch.randn(2, 3, 61, 45))
    assert [o.shape for o in outs] == [(2, MINI['embed_dims'][i], *expected_hw(61, 45, i))
                                       for i in expect]


def test_outputs_are_normed_per_stage():
    """Each output passes through its stage's closing LayerNorm: unit variance over channels."""
    model = LaplacianFormer(arch=MINI).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    for out in outs:
        var = out.var(dim=1, unbiased=False)
        torch.testing.assert_close(var, torch.ones_like(var), rtol=0, atol=1e-3)


def test_bf16_autocast_training_step_finite():
    model = LaplacianFormer(arch=MINI).train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = sum(o.float().square().mean() for o in model(torch.randn(2, 3, 64, 48)))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)



def test_bf16_autocast_keeps_the_nystrom_island_fp32(monkeypatch):
    """Under bf16 autocast the kernel matrices and the inverse see fp32 (the design's island);
    the attention returns autocast's bf16 within 2e-2 of the fp32 peak (measured ~5e-3)."""
    seen = []
    for name in ('laplacian_kernel', 'newton_schulz_pinv'):
        real = getattr(lf_mod, name)
        monkeypatch.setattr(lf_mod, name, lambda a, *args, _real=real, **kw: seen.append(
            a.dtype) or _real(a, *args, **kw))
    torch.manual_seed(0)
    attn = LaplacianAttention(32, 2, sr_ratio=4).eval()
    x = torch.randn(2, 12 * 10, 32)
    with torch.no_grad():
        ref = attn(x, (12, 10))
        seen.clear()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = attn(x, (12, 10))
    assert len(seen) == 3 and set(seen) == {torch.float32}  # K(z, L), K(L, L), the inverse
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max()

@pytest.mark.parametrize('kernel,whitening', [('gaussian', 'query'), ('laplacian', None),
                                              ('gaussian', None), ('gaussian', 'kernel'),
                                              ('laplacian', 'query')])
def test_variants_run_and_train(kernel, whitening, monkeypatch):
    calls = []
    real = lf_mod.laplacian_kernel
    monkeypatch.setattr(lf_mod, 'laplacian_kernel',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = LaplacianFormer(arch=MINI, kernel=kernel, whitening=whitening).train()
    assert len(whitening_modules(model)) == (3 if whitening else 0)  # one per kernel stage
    loss = sum(o.square().mean() for o in model(torch.randn(2, 3, 64, 48)))
    loss.backward()
    assert torch.isfinite(loss)
    grad = model.layers[0].blocks[0].attn.q.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert bool(calls) == (kernel == 'laplacian')


def test_ops_receive_lam_iters_eps_and_landmarks(monkeypatch):
    kernel_calls, pinv_calls = [], []
    real_k, real_p = lf_mod.laplacian_kernel, lf_mod.newton_schulz_pinv

    def spy_kernel(x, y, lam, **kw):
        kernel_calls.append((tuple(x.shape), tuple(y.shape), lam, kw.get('backend')))
        return real_k(x, y, lam, **kw)

    def spy_pinv(a, iters, eps, **kw):
        pinv_calls.append((tuple(a.shape), iters, eps, kw.get('backend'), kw.get('backward')))
        return real_p(a, iters, eps, **kw)

    monkeypatch.setattr(lf_mod, 'laplacian_kernel', spy_kernel)
    monkeypatch.setattr(lf_mod, 'newton_schulz_pinv', spy_pinv)
    model = LaplacianFormer(arch=MINI, lam=2.5, ns_iters=7, eps=0.03, whitening_stats='per_head',
                            attn_backend='reference').eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 61, 45))  # stage grids 16x12, 8x6, 4x3, 2x2
    # two kernel calls (K(Z, L), K(L, L)) and one inverse per kernel-attention block
    assert len(kernel_calls) == 6 and len(pinv_calls) == 3
    assert {c[2] for c in kernel_calls} == {2.5} and {c[3] for c in kernel_calls} == {'reference'}
    # the official operator's gradient by default (-V^T G V^T)
    assert {c[1:] for c in pinv_calls} == {(7, 0.03, 'reference', 'implicit')}
    # landmarks: ceil(H / sr) x ceil(W / sr) cells, sr = 8, 4, 2
    m = [math.ceil(16 / 8) * math.ceil(12 / 8), math.ceil(8 / 4) * math.ceil(6 / 4),
         math.ceil(4 / 2) * math.ceil(3 / 2)]
    heads, dims = MINI['num_heads'], MINI['embed_dims']
    for i in range(3):
        assert kernel_calls[2 * i] == ((1, heads[i], [192, 48, 12][i], dims[i] // heads[i]),
                                       (1, heads[i], m[i], dims[i] // heads[i]), 2.5,
                                       'reference')
        assert pinv_calls[i][0] == (1, heads[i], m[i], m[i])


def test_ns_backward_reaches_every_inverse(monkeypatch):
    seen = []
    real = lf_mod.newton_schulz_pinv
    monkeypatch.setattr(lf_mod, 'newton_schulz_pinv',
                        lambda a, *args, **kw: seen.append(kw['backward']) or real(a, *args, **kw))
    model = LaplacianFormer(arch=MINI, ns_backward='unrolled')
    sum(o.sum() for o in model(torch.randn(2, 3, 64, 64))).backward()
    assert seen == ['unrolled'] * 3
    assert "ns_backward='unrolled'" in repr(model)


def test_max_landmarks_caps_the_inverted_matrices(monkeypatch):
    sizes = []
    real = lf_mod.newton_schulz_pinv
    monkeypatch.setattr(lf_mod, 'newton_schulz_pinv',
                        lambda a, *args, **kw: sizes.append(a.shape[-1]) or real(a, *args, **kw))
    model = LaplacianFormer(arch=MINI, max_landmarks=5, whitening_stats='per_head').eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 160, 128))  # grids 40x32, 20x16, 10x8: 5x4 landmarks uncapped
    expect = []
    for (h, w), sr in (((40, 32), 8), ((20, 16), 4), ((10, 8), 2)):
        side = landmark_cell((h, w), sr, 5)
        assert side > sr  # 5 x 4 = 20 landmarks without the cap
        expect.append(math.ceil(h / side) * math.ceil(w / side))
    assert sizes == expect
    assert max(sizes) <= 5


@pytest.mark.parametrize('hw,sr,cap,side', [((56, 56), 8, None, 8), ((56, 56), 8, 49, 8),
                                            ((56, 56), 8, 48, 10), ((200, 334), 8, 128, 24),
                                            ((5, 7), 2, 1, 7), ((3, 3), 8, 1, 8)])
def test_landmark_cell(hw, sr, cap, side):
    assert landmark_cell(hw, sr, cap) == side
    if cap is not None:
        cells = math.ceil(hw[0] / side) * math.ceil(hw[1] / side)
        smaller = math.ceil(hw[0] / (side - 1)) * math.ceil(hw[1] / (side - 1))
        assert cells <= cap and (side == sr or smaller > cap)


# ------------------------------------------------------------------------------- attention
def test_pool_landmarks_odd_grid_matches_cells():
    x = torch.randn(2, 3, 5 * 7, 4, dtype=torch.float64)
    out = pool_landmarks(x, (5, 7), 3)  # cells: rows 0-2, 3-4; cols 0-2, 3-5, 6
    grid = x.reshape(2, 3, 5, 7, 4)
    expect = torch.stack([grid[:, :, r:r + 3, c:c + 3].mean(dim=(2, 3))
                          for r in (0, 3) for c in (0, 3, 6)], dim=2)
    torch.testing.assert_close(out, expect)
    assert pool_landmarks(x, (5, 7), 1) is x
    # heads split off [B, N, heads*D] tokens (the backbone's layout): the same landmarks
    split = x.transpose(1, 2).reshape(2, 35, 12).reshape(2, 35, 3, 4).transpose(1, 2)
    assert not split.is_contiguous()
    torch.testing.assert_close(pool_landmarks(split, (5, 7), 3), expect)
    torch.testing.assert_close(pool_landmarks(split, (5, 7), grid=2),
                               pool_landmarks(x, (5, 7), grid=2))


def test_nystrom_attention_matches_the_dense_formula():
    """``K(q, L) K(L, L)^-1 K(L, k) v / N`` with the inverse formed densely: the weights
    (``v`` None), their product with ``v``, shared keys, and the query-side whitening."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (9, 11, 11))
    lm = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)

    def kernel(x, y):
        return torch.exp(-torch.cdist(x, y, p=1) / 4)

    def solve(a, r):
        return torch.linalg.solve(a, r)

    dense = kernel(q, lm) @ torch.linalg.inv(kernel(lm, lm)) @ kernel(lm, k) / 11  # [2, 3, 9, 11]
    torch.testing.assert_close(nystrom_attention(q, lm, kernel, solve, k=k), dense)
    torch.testing.assert_close(nystrom_attention(q, lm, kernel, solve, v, k=k), dense @ v)
    shared = kernel(k, lm) @ torch.linalg.inv(kernel(lm, lm)) @ kernel(lm, k) / 11
    torch.testing.assert_close(nystrom_attention(k, lm, kernel, solve, v), shared @ v)
    whitened = (2 * kernel(k, lm)) @ torch.linalg.inv(kernel(lm, lm)) @ kernel(lm, k) / 11
    torch.testing.assert_close(nystrom_attention(k, lm, kernel, solve, v, whiten=lambda s: 2 * s),
                               whitened @ v)


def test_gaussian_kernel_matches_definition():
    x, y = torch.randn(2, 3, 9, 5, dtype=torch.float64), torch.randn(2, 3, 4, 5,
                                                                      dtype=torch.float64)
    dense = torch.exp(-((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1) / 2)
    torch.testing.assert_close(gaussian_kernel(x, y), dense)


@pytest.mark.parametrize('kernel', ['laplacian', 'gaussian'])
def test_nystrom_attention_equals_dense_formula(kernel):
    """The attention against ``proj(K(Z,L) (K(L,L) + eps I)^-1 K(L,Z) V / N + DWC(V))`` computed
    densely in fp64 (explicit pairwise distances, a true inverse, explicit cell means)."""
    torch.manual_seed(0)
    H, W, C, nh, sr, lam, eps = 5, 7, 8, 2, 2, 3.0, 0.05
    attn = LaplacianAttention(C, nh, sr_ratio=sr, kernel=kernel, lam=lam, ns_iters=60, eps=eps,
                              dwc_kernel=3, **OLD).double().eval()
    with torch.no_grad():
        attn.whiten.running_mean.uniform_(-1, 1)
        attn.whiten.running_var.uniform_(0.5, 2)
        attn.whiten.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, H * W, C, dtype=torch.float64)
    out = attn(x, (H, W))

    with torch.no_grad():
        B, N, hd = 2, H * W, C // nh
        q = x @ attn.q.weight.T + attn.q.bias
        z = (q - attn.whiten.running_mean) / torch.sqrt(attn.whiten.running_var + 1e-5) + \
            attn.whiten.bias
        z = z.reshape(B, N, nh, hd).transpose(1, 2)  # [B, nh, N, hd]
        v = x @ attn.v.weight.T + attn.v.bias  # [B, N, C]
        vh = v.reshape(B, N, nh, hd).transpose(1, 2)
        grid = z.reshape(B, nh, H, W, hd)
        lm = torch.stack([grid[:, :, r:r + sr, c:c + sr].mean(dim=(2, 3))
                          for r in range(0, H, sr) for c in range(0, W, sr)], dim=2)
        if kernel == 'laplacian':  # feature_scale='sqrt_head_dim'
            z, lm = z / math.sqrt(hd), lm / math.sqrt(hd)

            def k(a, b):
                return torch.exp(-(a[..., :, None, :] - b[..., None, :, :]).abs().sum(-1) / lam)
        else:  # SOFT's own scale times feature_scale
            z, lm = z / hd ** 0.75, lm / hd ** 0.75

            def k(a, b):
                return torch.exp(-((a[..., :, None, :] - b[..., None, :, :]) ** 2).sum(-1) / 2)
        M = lm.shape[2]
        inv = torch.linalg.inv(k(lm, lm) + eps * torch.eye(M, dtype=torch.float64))
        a_dense = k(z, lm) @ inv @ k(lm, z)  # [B, nh, N, N]: the approximated kernel matrix
        y = (a_dense @ vh / N).transpose(1, 2).reshape(B, N, C)
        y = y + attn.dwc(v.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
        expect = y @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(out, expect, rtol=1e-7, atol=1e-9)


def test_attention_uses_batch_statistics_in_train_and_running_in_eval():
    torch.manual_seed(0)
    attn = LaplacianAttention(16, 2, sr_ratio=2, ns_iters=10)
    x = torch.randn(2, 6 * 5, 16)
    other = torch.cat([x[:1], 3 * x[1:] + 1])
    with torch.no_grad():
        attn.train()
        diff_train = (attn(x, (6, 5))[0] - attn(other, (6, 5))[0]).abs().max()
        attn.eval()
        diff_eval = (attn(x, (6, 5))[0] - attn(other, (6, 5))[0]).abs().max()
    assert diff_train > 1e-3 and diff_eval == 0


def test_whitening_batch_statistics_in_train_running_in_eval():
    torch.manual_seed(0)
    wh = DiagonalWhitening(6, momentum=0.1)
    with torch.no_grad():
        wh.bias.copy_(torch.arange(6.))
    x = torch.randn(3, 50, 6) * torch.linspace(0.5, 3, 6) + torch.linspace(-2, 2, 6)
    z = wh.train()(x)
    flat = z.reshape(-1, 6)
    # per dimension: mean = bias, variance 1 (over all tokens of the batch), no scale
    torch.testing.assert_close(flat.mean(0), torch.arange(6.), rtol=0, atol=1e-5)
    torch.testing.assert_close(flat.var(0, unbiased=False), torch.ones(6), rtol=0, atol=1e-3)
    xf = x.reshape(-1, 6)
    torch.testing.assert_close(wh.running_mean, 0.1 * xf.mean(0))
    torch.testing.assert_close(wh.running_var, 0.9 + 0.1 * xf.var(0, unbiased=True))
    # the same token gives a different output in another batch while training...
    other = torch.cat([x[:1], 5 + x[1:]])
    assert not torch.allclose(wh(other)[0], z[0])
    # ...and only the running estimates in eval
    wh.eval()
    running = (wh.running_mean.clone(), wh.running_var.clone())
    ze = wh(x)
    torch.testing.assert_close(ze, (x - running[0]) / torch.sqrt(running[1] + 1e-5) + wh.bias)
    torch.testing.assert_close(wh(other)[0], ze[0])
    assert torch.equal(wh.running_mean, running[0])  # eval does not update them
    with pytest.raises(ValueError, match='at least 2 tokens'):
        wh.train()(torch.randn(1, 1, 6))


def test_model_whitening_uses_batch_stats_in_train_and_running_in_eval():
    torch.manual_seed(0)
    model = LaplacianFormer(arch=MINI, drop_path_rate=0.)
    x = torch.randn(2, 3, 48, 48)
    other = torch.cat([x[:1], 3 * x[1:]])
    with torch.no_grad():
        model.train()
        model(x)  # (the batch dependence itself: test_attention_uses_batch_statistics_...)
        means = [m.running_mean.clone() for m in whitening_modules(model)]
        assert all(m.abs().sum() > 0 for m in means)  # updated by the training forwards
        model.eval()
        a, b = model(x)[0][0], model(other)[0][0]
        torch.testing.assert_close(a, b)  # not in eval
        for m, before in zip(whitening_modules(model), means):
            assert torch.equal(m.running_mean, before)


# ------------------------------------------------------------------------------- training modes


@pytest.mark.parametrize('whitening', ['kernel', 'query'])
def test_norm_eval_freezes_whitening_statistics(whitening):
    model = LaplacianFormer(arch=MINI, norm_eval=True, whitening=whitening)
    model.train()
    assert model.training and model.layers[0].blocks[0].norm1.training  # LayerNorms untouched
    assert all(not m.training for m in whitening_modules(model))
    before = [m.running_mean.clone() for m in whitening_modules(model)]
    model(torch.randn(2, 3, 48, 48))
    assert all(torch.equal(m.running_mean, b) for m, b in zip(whitening_modules(model), before))
    assert len(before) == 3
    model = LaplacianFormer(arch=MINI, norm_eval=False, whitening=whitening).train()
    assert all(m.training for m in whitening_modules(model))


def test_triton_backend_matches_reference(monkeypatch):
    """The model through the ops' Triton kernels (compiled on GPU, interpreted on CPU)."""
    from mmeffattn.ops.laplacian import op as lap_op
    from mmeffattn.ops.laplacian.op import laplacian_triton_reasons
    from mmeffattn.ops.newton_schulz import op as ns_op
    from mmeffattn.ops.newton_schulz.op import newton_schulz_triton_reasons

    probe = torch.zeros(1, 1, 2, 2)
    reasons = laplacian_triton_reasons(probe, probe) + newton_schulz_triton_reasons(probe)
    if reasons:
        pytest.skip('Triton backend unavailable: ' + '; '.join(reasons))
    torch.manual_seed(0)
    arch = dict(MINI, embed_dims=[8, 16, 16, 16], num_heads=[1, 1, 1, 1])
    ref = LaplacianFormer(arch=arch, attn_backend='reference').eval()
    tri = LaplacianFormer(arch=arch, attn_backend='triton').eval()
    tri.load_state_dict(ref.state_dict())
    calls = []
    for mod, name in ((lap_op, 'laplacian_kernel_triton'), (ns_op, 'newton_schulz_pinv_triton')):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    x = torch.randn(1, 3, 40, 36)
    with torch.no_grad():
        outs_ref = ref(x)
        assert not calls
        for a, b in zip(outs_ref, tri(x)):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert calls.count('laplacian_kernel_triton') == 6
    assert calls.count('newton_schulz_pinv_triton') == 3


# ------------------------------------------------------------------------------- weights
def test_pretrained_classifier_checkpoint_loads(tmp_path):
    """An mmpretrain ImageNet checkpoint: backbone. prefix plus the head, which is ignored."""
    src = LaplacianFormer(arch=MINI, out_indices=(3, ))
    state = {f'backbone.{k}': v for k, v in src.state_dict().items()}
    state.update({'head.fc.weight': torch.zeros(1000, 64), 'head.fc.bias': torch.zeros(1000)})
    path = tmp_path / 'in1k.pth'
    torch.save({'state_dict': state}, path)
    dst = LaplacianFormer(arch=MINI, init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                                   prefix='backbone.'))
    dst.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(v, dst.state_dict()[k]), k


def test_pretrained_whitening_off_checkpoint_into_whitening_model_raises(tmp_path):
    path = tmp_path / 'nowhite.pth'
    torch.save(LaplacianFormer(arch=MINI, whitening=None).state_dict(), path)
    model = LaplacianFormer(arch=MINI, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r'kwhiten\.running_mean'):
        model.init_weights()


def test_default_init():
    model = LaplacianFormer(arch=MINI)
    model.init_weights()
    lin = model.layers[0].blocks[0].attn.q
    assert lin.bias.abs().max() == 0 and 0.01 < lin.weight.std() < 0.03
    ln = model.layers[0].norm
    assert torch.all(ln.weight == 1) and torch.all(ln.bias == 0)
    for wh in (model.layers[0].blocks[0].attn.kwhiten,
               LaplacianFormer(arch=MINI, whitening='query').layers[0].blocks[0].attn.whiten):
        assert torch.all(wh.bias == 0) and torch.all(wh.running_var == 1)


# ------------------------------------------------------------------------------- registries
def test_build_from_registries():
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    with torch.device('meta'):
        model = MODELS.build(dict(type='mmeffattn.LaplacianFormer', arch='small', lam=3.))
    assert isinstance(model, LaplacianFormer) and model.lam == 3.
    det = DET_MODELS.build(dict(type='mmeffattn.LaplacianFormer', arch=MINI,
                                out_indices=(1, 2, 3)))
    assert isinstance(det, LaplacianFormer) and det.out_indices == (1, 2, 3)
    seg = SEG_MODELS.build(dict(type='mmeffattn.LaplacianFormer', arch=MINI, kernel='gaussian'))
    assert seg.layers[0].blocks[0].attn.kernel == 'gaussian'


# ------------------------------------------------------------------------------- issue 11 switches
def _kernel(a: torch.Tensor, b: torch.Tensor, lam: float) -> torch.Tensor:
    """exp(-||a_i - b_j||_1 / lam) by explicit pairwise differences."""
    return torch.exp(-(a[..., :, None, :] - b[..., None, :, :]).abs().sum(-1) / lam)


@pytest.mark.parametrize('kwargs,match', [
    (dict(whitening='keys'), 'whitening must be one of'),
    (dict(whitening=True), 'whitening must be one of'),
    (dict(whitening_stats='per_token'), 'whitening_stats must be one of'),
    (dict(landmark_grid=0), 'landmark_grid must be an integer'),
    (dict(feature_scale=0.), 'feature_scale must be None'),
    (dict(feature_scale='head_dim'), 'feature_scale must be None'),
    (dict(pinv_solver='lu'), 'pinv_solver must be one of'),
    (dict(cg_iters=0), 'cg_iters must be an integer'),
    (dict(cg_tol=-1.), 'cg_tol must be a number'),
])
def test_invalid_new_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LaplacianFormer(arch=MINI, **kwargs)


@pytest.mark.parametrize('change', [
    dict(whitening='query'), dict(whitening=None), dict(whitening_stats='per_head'),
    dict(feature_scale=0.5), dict(feature_scale='sqrt_head_dim'),
    dict(pinv_solver='cg', cg_iters=2),  # converged CG matches Newton-Schulz (test below)
    dict(landmark_grid=3), dict(lam=2.)], ids=lambda d: '-'.join(f'{k}={v}' for k, v in d.items()))
def test_each_switch_changes_the_computation(change):
    """Each switch against the default (same shared weights, eval mode); training with it gives
    finite outputs and gradients."""
    torch.manual_seed(0)
    base = LaplacianFormer(arch=MINI, drop_path_rate=0.).eval()
    other = LaplacianFormer(arch=MINI, drop_path_rate=0., **change).eval()
    mine = other.state_dict()  # the shared weights (the whitening entries may differ)
    other.load_state_dict({k: v for k, v in base.state_dict().items()
                           if k in mine and mine[k].shape == v.shape}, strict=False)
    x = torch.randn(2, 3, 61, 45)
    with torch.no_grad():
        a, b = base(x)[2], other(x)[2]
    assert a.shape == b.shape and not torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    other.train()
    outs = other(x)
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for p in other.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert other.layers[0].blocks[0].attn.q.weight.grad.abs().sum() > 0


def test_lam_is_the_bandwidth_on_the_features_the_kernel_sees():
    """exp(-||a q - a k||_1 / lam) = exp(-||q - k||_1 / (lam / a)): feature_scale=a with lam is
    the unscaled model with lam / a, so lam alone is the paper's lambda."""
    torch.manual_seed(0)
    scaled = LaplacianFormer(arch=MINI, lam=4., feature_scale=0.25).eval()
    plain = LaplacianFormer(arch=MINI, lam=16.).eval()
    plain.load_state_dict(scaled.state_dict())
    x = torch.randn(1, 3, 48, 40)
    with torch.no_grad():
        for a, b in zip(scaled(x), plain(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('stats', ['per_landmark', 'per_head'])
@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_kernel_whitening_attention_equals_paper_formula_fp64(stats, mode):
    """whitening='kernel' inside the attention against the paper's map written out in fp64:
    z_i = Sigma^-1/2 (s_i - mu) + beta on s_i = [k(q_i, l_m)]_m, entering the Nystrom product as
    Out = Z (K(L,L) + eps I)^-1 K(L,Q) V / N (docs/design/laplacian_whitening.md, section 1)."""
    torch.manual_seed(0)
    H, W, C, nh, g, lam, eps = 6, 4, 8, 2, 2, 3.0, 0.05
    attn = LaplacianAttention(C, nh, sr_ratio=2, lam=lam, ns_iters=60, eps=eps, dwc_kernel=3,
                              whitening='kernel', whitening_stats=stats,
                              landmark_grid=g).double()
    wh = attn.kwhiten
    with torch.no_grad():
        wh.bias.uniform_(-0.5, 0.5)
        wh.running_mean.uniform_(0, 1)
        wh.running_var.uniform_(0.5, 2)
    before_mean, before_var = wh.running_mean.clone(), wh.running_var.clone()
    attn.train(mode == 'train')
    B, N, hd = 3, H * W, C // nh
    x = torch.randn(B, N, C, dtype=torch.float64)
    out = attn(x, (H, W))

    with torch.no_grad():
        q = (x @ attn.q.weight.T + attn.q.bias).reshape(B, N, nh, hd).transpose(1, 2)
        v = x @ attn.v.weight.T + attn.v.bias  # [B, N, C]
        vh = v.reshape(B, N, nh, hd).transpose(1, 2)
        grid = q.reshape(B, nh, H, W, hd)
        ch, cw = H // g, W // g  # the fixed g x g grid (per-head stats: sr x sr cells, sr 2)
        cells = [(r, c, ch, cw) for r in range(0, H, ch) for c in range(0, W, cw)] \
            if stats == 'per_landmark' else \
            [(r, c, 2, 2) for r in range(0, H, 2) for c in range(0, W, 2)]
        lm = torch.stack([grid[:, :, r:r + h, c:c + w].mean(dim=(2, 3)) for r, c, h, w in cells],
                         dim=2)  # [B, nh, M, hd]
        M = lm.shape[2]
        s = _kernel(q, lm, lam)  # [B, nh, N, M]
        dims = (0, 2) if stats == 'per_landmark' else (0, 2, 3)
        beta = wh.bias.reshape(1, nh, 1, -1)  # [1, nh, 1, M or 1]
        if mode == 'train':
            mu = s.mean(dim=dims, keepdim=True)
            var = s.var(dim=dims, unbiased=False, keepdim=True)
        else:
            mu, var = before_mean.reshape(1, nh, 1, -1), before_var.reshape(1, nh, 1, -1)
        z = (s - mu) / torch.sqrt(var + wh.eps) + beta
        core = torch.linalg.inv(_kernel(lm, lm, lam) + eps * torch.eye(M, dtype=torch.float64))
        y = (z @ core @ _kernel(lm, q, lam) @ vh / N).transpose(1, 2).reshape(B, N, C)
        y = y + attn.dwc(v.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
        expect = y @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(out, expect, rtol=1e-7, atol=1e-9)
    if mode == 'train':  # the running estimates moved towards the batch statistics (once)
        n = s.numel() / s.shape[1] / (1 if stats == 'per_head' else M)
        unbiased = s.var(dim=dims, unbiased=True).reshape(nh, -1)
        torch.testing.assert_close(wh.running_mean, 0.9 * before_mean +
                                   0.1 * s.mean(dim=dims).reshape(nh, -1))
        torch.testing.assert_close(wh.running_var, 0.9 * before_var + 0.1 * unbiased)
        assert n > 1
    else:
        assert torch.equal(wh.running_mean, before_mean)


def test_cg_and_newton_schulz_agree_on_a_well_conditioned_case(monkeypatch):
    """A large ridge makes K(L,L) + eps I well conditioned: both solvers converge to the same
    product; CG gets cg_iters / cg_tol / eps."""
    calls = []
    real = lf_mod.conjugate_gradient_solve

    def spy(a, b, eps, **kw):
        calls.append((tuple(a.shape), eps, kw))
        return real(a, b, eps, **kw)

    monkeypatch.setattr(lf_mod, 'conjugate_gradient_solve', spy)
    torch.manual_seed(0)
    ns = LaplacianFormer(arch=MINI, eps=1., ns_iters=40).eval()
    cg = LaplacianFormer(arch=MINI, eps=1., pinv_solver='cg', cg_iters=60, cg_tol=1e-9).eval()
    cg.load_state_dict(ns.state_dict())
    x = torch.randn(1, 3, 61, 45)
    with torch.no_grad():
        out_ns, out_cg = ns(x), cg(x)
    for a, b in zip(out_ns, out_cg):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert len(calls) == 3 and {c[0][-1] for c in calls} == {49}
    assert all(c[1] == 1. and c[2] == dict(iters=60, tol=1e-9) for c in calls)
    # and at the default ridge the two solvers still give close (not identical) outputs
    a = LaplacianFormer(arch=MINI).eval()
    b = LaplacianFormer(arch=MINI, pinv_solver='cg', cg_iters=200, cg_tol=1e-8).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert (a(x)[2] - b(x)[2]).abs().max() < 0.05 * a(x)[2].abs().max()


def test_fixed_landmark_grid_for_per_landmark_statistics(monkeypatch):
    """Per-landmark statistics pool a fixed grid (M = 49 at every size, equal to the sr cells at
    224); per-head statistics keep sr cells."""
    x = torch.randn(1, 2, 56 * 56, 4, dtype=torch.float64)
    torch.testing.assert_close(pool_landmarks(x, (56, 56), grid=7), pool_landmarks(x, (56, 56), 8))
    sizes = []
    real = lf_mod.newton_schulz_pinv
    monkeypatch.setattr(lf_mod, 'newton_schulz_pinv',
                        lambda a, *args, **kw: sizes.append(a.shape[-1]) or real(a, *args, **kw))
    model = LaplacianFormer(arch=MINI).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 61, 45))
        model(torch.randn(1, 3, 96, 128))
    assert sizes == [49] * 6


def test_with_cp_counts_the_batch_once_in_kernel_whitening_statistics():
    torch.manual_seed(0)
    plain = LaplacianFormer(arch=MINI, drop_path_rate=0.).train()
    ckpt = LaplacianFormer(arch=MINI, drop_path_rate=0., with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 48, 40)
    for model in (plain, ckpt):
        sum(o.square().mean() for o in model(x)).backward()
    kw_plain = [m for m in plain.modules() if isinstance(m, KernelWhitening)]
    kw_ckpt = [m for m in ckpt.modules() if isinstance(m, KernelWhitening)]
    assert len(kw_ckpt) == 3
    for a, b in zip(kw_plain, kw_ckpt):
        torch.testing.assert_close(b.running_mean, a.running_mean)
        torch.testing.assert_close(b.running_var, a.running_var)
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize('name,expect', [
    ('laplacianformer-t_8xb128_in1k', dict(whitening='kernel', feature_scale=None,
                                           pinv_solver='newton_schulz', lam=4.)),
    ('laplacianformer-t_cg_8xb128_in1k', dict(whitening='kernel', pinv_solver='cg')),
    ('laplacianformer-t_query-whitening_8xb128_in1k', dict(whitening='query',
                                                          feature_scale='sqrt_head_dim')),
    ('mask-rcnn_laplacianformer-t_fpn_1x_coco', dict(whitening='kernel',
                                                     whitening_stats='per_landmark')),
])
def test_configs_hold_the_switches(name, expect):
    """The paper's setting by default; the ablation configs change only what they name
    (tests/configs builds every config)."""
    from os.path import abspath, dirname, join

    from mmengine.config import Config
    root = dirname(dirname(dirname(abspath(__file__))))
    backbone = Config.fromfile(join(root, 'configs', 'laplacianformer', f'{name}.py')).model.backbone
    with torch.device('meta'):
        model = MODELS.build(dict(backbone, init_cfg=None))
    attn = model.layers[0].blocks[0].attn
    for key, value in expect.items():
        assert getattr(model, key, getattr(attn, key, None)) == value, key


def test_half_model_kernel_whitening_updates_its_16bit_running_estimates():
    torch.manual_seed(0)
    attn = LaplacianAttention(16, 2, sr_ratio=2, landmark_grid=2).half().train()
    wh = attn.kwhiten
    with torch.no_grad():
        out = attn(torch.randn(2, 6 * 4, 16).half(), (6, 4))
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert wh.running_mean.dtype == torch.float16 and wh.running_mean.abs().sum() > 0
    assert 'running_mean' in wh._buffers and wh._buffers['running_mean'] is wh.running_mean
