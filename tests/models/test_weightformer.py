"""Tests of the WeightFormer backbone (mmeffattn/models/backbones/weightformer.py), its feature
pyramid (mmeffattn/models/layers/vit_pyramid.py) and the official checkpoint converter
(tools/model_converters/weightformer_official.py).

The official model (LeapLabTHU/WeightFormer, model/wfm.py) is never imported or copied here. Two
test-only oracles are written from reading it instead: its parameter count as a formula of
(dim, depth, mlp ratio) with the list of its state-dict keys and shapes, and a functional
forward pass over an official-keyed state dict.
"""
import copy
import os.path as osp
import sys
import types
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.backbones.weightformer import (DynamicDWConv, DynamicLinear, WeightFormer,
                                                     checkpoint_filter_weightformer,
                                                     checkpoint_filter_weightformer_official)
from mmeffattn.models.layers import ViTPyramid
from mmeffattn.models.layers.vit_pyramid import CeilMaxPool2d
from mmeffattn.registry import MODELS
from tools.model_converters import weightformer_official as converter_cli

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

ARCHS = {'tiny': (192, 17), 'small': (384, 17), 'base': (384, 17)}  # cfg/wfm_{t,s,b}.yaml
# A reduced arch for mechanism tests: dynamic blocks 1 and 4, as the real rule gives.
MINI = dict(embed_dims=32, depth=5)
OUT_TYPES = ['featmap', 'avgpool', 'pyramid']


@pytest.fixture(scope='module')
def tiny_models():
    """One eval-mode tiny model per out_type, shared by the tests that do not modify it."""
    torch.manual_seed(0)
    return {t: WeightFormer(arch='tiny', out_type=t).eval() for t in OUT_TYPES}


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------- oracles
def official_shapes(dim: int, depth: int, mlp_ratio: float = 4., num_classes: int = 1000,
                    in_chans: int = 3, patch: int = 16) -> 'OrderedDict[str, tuple]':
    """Every state-dict key of the official ``VisionTransformer`` (model/wfm.py) with its shape,
    written from reading that file: ``DynLinear`` (w [in, out], b, wfm Linear(in, in/4 + out/4),
    w1 [in/4, in], w2 [out/4, out]) and ``DynCnn`` (w [C, 1, 3, 3], b, wfm = 1x1 conv, GELU,
    1x1 conv without bias) in blocks with (i + 2) % 3 == 0, which also have norm1."""
    h, r = int(dim * mlp_ratio), 4
    s = OrderedDict()
    s['patch_embed.proj.weight'] = (dim, in_chans, patch, patch)
    s['patch_embed.proj.bias'] = (dim, )
    s['init_norm.weight'] = s['init_norm.bias'] = (dim, )
    for i in range(depth):
        p = f'blocks.{i}.'
        s[p + 'norm2.weight'] = s[p + 'norm2.bias'] = (dim, )
        if (i + 2) % 3 == 0:
            s[p + 'norm1.weight'] = s[p + 'norm1.bias'] = (dim, )
            s[p + 'linear1.w'] = (dim, h)
            s[p + 'linear1.b'] = (h, )
            s[p + 'linear1.wfm.weight'] = (dim // r + h // r, dim)
            s[p + 'linear1.wfm.bias'] = (dim // r + h // r, )
            s[p + 'linear1.w1'] = (dim // r, dim)
            s[p + 'linear1.w2'] = (h // r, h)
            s[p + 'dwc.w'] = (dim, 1, 3, 3)
            s[p + 'dwc.b'] = (dim, )
            s[p + 'dwc.wfm.0.weight'] = (dim, dim, 1, 1)
            s[p + 'dwc.wfm.0.bias'] = (dim, )
            s[p + 'dwc.wfm.2.weight'] = (dim, dim, 1, 1)
        else:
            s[p + 'linear1.weight'] = (h, dim)
            s[p + 'linear1.bias'] = (h, )
            s[p + 'dwc.weight'] = (dim, 1, 3, 3)
            s[p + 'dwc.bias'] = (dim, )
        s[p + 'linear2.weight'] = (dim, h)
        s[p + 'linear2.bias'] = (dim, )
    s['norm.weight'] = s['norm.bias'] = (dim, )
    s['head.weight'] = (num_classes, dim)
    s['head.bias'] = (num_classes, )
    return s


def official_param_count(dim: int, depth: int, mlp_ratio: float = 4., num_classes: int = 1000,
                         in_chans: int = 3, patch: int = 16) -> int:
    """The official classifier's parameter count, analytically from model/wfm.py."""
    h, r, ln = int(dim * mlp_ratio), 4, 2 * dim
    n_dyn = sum((i + 2) % 3 == 0 for i in range(depth))
    common = ln + h * dim + dim  # norm2, linear2
    static = dim * h + h + dim * 9 + dim  # linear1, depthwise 3x3 conv
    dynamic = (ln  # norm1
               + dim * h + h  # DynLinear static w, b
               + (dim + 1) * (dim // r + h // r)  # DynLinear wfm
               + (dim // r) * dim + (h // r) * h  # DynLinear w1, w2
               + dim * 9 + dim  # DynCnn static w, b
               + dim * dim + dim + dim * dim)  # DynCnn 1x1 conv (bias), 1x1 conv (no bias)
    return (dim * in_chans * patch * patch + dim + ln  # patch embedding, init_norm
            + depth * common + (depth - n_dyn) * static + n_dyn * dynamic
            + ln + dim * num_classes + num_classes)  # norm, head


def fake_official_state_dict(dim: int, depth: int,
                             seed: int = 0) -> 'OrderedDict[str, torch.Tensor]':
    """Random official-keyed weights, scaled so that every dynamic term visibly matters."""
    g = torch.Generator().manual_seed(seed)
    sd = OrderedDict()
    for k, shape in official_shapes(dim, depth).items():
        if 'norm' in k and k.endswith('weight'):
            t = 1 + 0.2 * torch.randn(shape, generator=g)
        elif k.endswith(('w1', 'w2')):
            t = 0.5 * torch.randn(shape, generator=g)
        elif 'wfm' in k:
            t = 0.3 * torch.randn(shape, generator=g)
        elif 'dwc' in k:
            t = 0.2 * torch.randn(shape, generator=g)
        else:
            t = 0.05 * torch.randn(shape, generator=g)
        sd[k] = t
    return sd


def official_forward_oracle(sd: dict, x: torch.Tensor, depth: int) -> torch.Tensor:
    """The official classifier's logits, re-derived functionally from model/wfm.py.

    Square inputs only (as the official code): patchify, init_norm, blocks, norm, token mean,
    head. Dynamic parts are computed one sample at a time, with explicit pooling.
    """
    dim = sd['init_norm.weight'].shape[0]

    def ln(t, name):
        return F.layer_norm(t, (dim, ), sd[name + '.weight'], sd[name + '.bias'], eps=1e-6)

    B = x.shape[0]
    fm = F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=16)
    s = fm.shape[-1]
    t = ln(fm.flatten(2).transpose(1, 2), 'init_norm')  # [B, s*s, dim]
    for i in range(depth):
        p = f'blocks.{i}.'
        dyn = (i + 2) % 3 == 0
        if dyn:
            t = ln(t, p + 'norm1')
        m = t.transpose(1, 2).reshape(B, dim, s, s)
        if dyn:
            g = F.adaptive_avg_pool2d(m, 3)
            g = F.conv2d(F.gelu(F.conv2d(g, sd[p + 'dwc.wfm.0.weight'], sd[p + 'dwc.wfm.0.bias'])),
                         sd[p + 'dwc.wfm.2.weight'])  # [B, dim, 3, 3]
            conv = []
            for b in range(B):
                k = g[b]
                k = k / (torch.linalg.vector_norm(k, dim=(1, 2), keepdim=True) + 1)
                k = k.unsqueeze(1) + sd[p + 'dwc.w']
                conv.append(F.conv2d(m[b:b + 1], k, sd[p + 'dwc.b'], padding=1, groups=dim))
            conv = torch.cat(conv)
        else:
            conv = F.conv2d(m, sd[p + 'dwc.weight'], sd[p + 'dwc.bias'], padding=1, groups=dim)
        t = t + conv.flatten(2).transpose(1, 2)
        h = ln(t, p + 'norm2')
        if dyn:
            hidden = []
            q = s // 2
            for b in range(B):
                grid = h[b].t().reshape(dim, s, s)[:, :2 * q, :2 * q]
                pooled = grid.reshape(dim, q, 2, q, 2).mean(dim=(2, 4)).reshape(dim, -1).t()
                a = pooled @ sd[p + 'linear1.wfm.weight'].t() + sd[p + 'linear1.wfm.bias']
                a_in, a_out = a[:, :dim // 4], a[:, dim // 4:]
                u = F.silu(a_in) @ sd[p + 'linear1.w1']  # [M, dim]
                v = F.silu(a_out) @ sd[p + 'linear1.w2']  # [M, 4 dim]
                dw = u.t() @ v * dim**-0.5 / (s * s)  # [dim, 4 dim]
                dw = dw / (torch.linalg.vector_norm(dw, dim=0, keepdim=True) + 1)
                hidden.append(h[b] @ (dw + sd[p + 'linear1.w']) + sd[p + 'linear1.b'])
            z = torch.stack(hidden)
        else:
            z = h @ sd[p + 'linear1.weight'].t() + sd[p + 'linear1.bias']
        t = t + F.gelu(z) @ sd[p + 'linear2.weight'].t() + sd[p + 'linear2.bias']
    feat = ln(t, 'norm').mean(dim=1)
    return feat @ sd['head.weight'].t() + sd['head.bias']


def build_classifier(arch: str = 'tiny', num_classes: int = 1000) -> nn.Module:
    from mmpretrain.registry import MODELS as CLS_MODELS
    dim = ARCHS[arch][0] if isinstance(arch, str) else arch['embed_dims']
    return CLS_MODELS.build(dict(
        type='ImageClassifier', _scope_='mmpretrain',  # whatever scope an earlier test left
        backbone=dict(type='mmeffattn.WeightFormer', arch=arch, out_type='avgpool'),
        neck=None,
        head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=dim)))


# ------------------------------------------------------------------------------- construction
@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_param_count_matches_official(arch):
    dim, depth = ARCHS[arch]
    with torch.device('meta'):
        model = WeightFormer(arch=arch, out_type='avgpool')  # norm16 = the official final norm
    ours = n_params(model) + dim * 1000 + 1000  # + LinearClsHead(1000)
    official = official_param_count(dim, depth)
    listed = sum(torch.Size(s).numel() for s in official_shapes(dim, depth).values())
    print(f'WeightFormer-{arch[0].upper()}: ours {ours:,} / official formula {official:,} '
          f'(backbone alone {n_params(model):,})')
    assert listed == official
    assert ours == official
    assert len(model.state_dict()) + 2 == len(official_shapes(dim, depth))


def test_official_formula_values():
    # anchors for the formula (T ~7.1M, S/B ~27.5M with the 1000-way head)
    assert official_param_count(192, 17) == 7_074_184
    assert official_param_count(384, 17) == 27_492_136


def test_dynamic_block_rule():
    with torch.device('meta'):
        model = WeightFormer(arch='tiny')
    assert model.dynamic_blocks == (1, 4, 7, 10, 13, 16)
    for i, blk in enumerate(model.blocks):
        assert blk.dynamic == (i in model.dynamic_blocks)
        assert hasattr(blk, 'norm1') == blk.dynamic
        assert isinstance(blk.dwc, DynamicDWConv if blk.dynamic else nn.Conv2d)
        assert isinstance(blk.mlp.fc1, DynamicLinear if blk.dynamic else nn.Linear)
        assert blk.norm2.eps == 1e-6


@pytest.mark.parametrize('every,expect', [
    (1, tuple(range(17))), (2, (0, 2, 4, 6, 8, 10, 12, 14, 16)),
    (3, (1, 4, 7, 10, 13, 16)), (4, (2, 6, 10, 14))])
def test_dynamic_every_counts_the_dynamic_blocks(every, expect):
    """dynamic_every (the paper's frequency ablation): block i is dynamic when (i + 2) % every
    == 0; 3 is the default and the official rule."""
    with torch.device('meta'):
        model = WeightFormer(arch='tiny', dynamic_every=every)
    dynamic = [i for i, blk in enumerate(model.blocks) if isinstance(blk.mlp.fc1, DynamicLinear)]
    assert tuple(dynamic) == model.dynamic_blocks == expect
    assert len(dynamic) == len(range(every - 2 if every >= 2 else 0, 17, every))
    assert sum(isinstance(blk.dwc, DynamicDWConv) for blk in model.blocks) == len(expect)
    assert sum(hasattr(blk, 'norm1') for blk in model.blocks) == len(expect)
    assert model.dynamic_every == every
    if every == 3:
        with torch.device('meta'):
            default = WeightFormer(arch='tiny')
        assert default.dynamic_blocks == expect
        assert [k for k in default.state_dict()] == [k for k in model.state_dict()]


def test_dynamic_every_changes_the_computation_and_trains():
    torch.manual_seed(0)
    base = WeightFormer(arch=MINI, out_type='featmap').eval()
    every = WeightFormer(arch=MINI, out_type='featmap', dynamic_every=2).eval()
    assert base.dynamic_blocks == (1, 4) and every.dynamic_blocks == (0, 2, 4)
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        a, b = base(x)[-1], every(x)[-1]
    assert a.shape == b.shape and not torch.allclose(a, b)
    every.train()
    loss = sum(o.square().mean() for o in every(x))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in every.parameters() if p.grad is not None)


@pytest.mark.parametrize('bad', [0, -3, 2.5, True])
def test_dynamic_every_invalid(bad):
    with pytest.raises(ValueError, match='dynamic_every must be an integer >= 1'):
        WeightFormer(arch=MINI, dynamic_every=bad)


def test_arch_aliases_custom_and_invalid():
    assert WeightFormer._parse_arch('T') == WeightFormer._parse_arch('tiny')
    assert WeightFormer._parse_arch('b') == WeightFormer._parse_arch('small')
    model = WeightFormer(arch=MINI, out_type='featmap')
    assert model.dynamic_blocks == (1, 4) and model.out_indices == (0, 1, 2, 4)
    with pytest.raises(KeyError, match=r"Unknown arch 'huge'.*'base'.*'small'.*'tiny'"):
        WeightFormer(arch='huge')
    with pytest.raises(ValueError, match='depth'):
        WeightFormer(arch=dict(embed_dims=32))
    with pytest.raises(ValueError, match="arch 'depth' must be >= 1, got 0"):
        WeightFormer(arch=dict(embed_dims=32, depth=0))
    with pytest.raises(ValueError, match='divisible by 4'):
        WeightFormer(arch=dict(embed_dims=30, depth=2))


def test_default_out_indices():
    with torch.device('meta'):
        assert WeightFormer(arch='t').out_indices == (3, 7, 11, 16)
        assert WeightFormer(arch='t', out_type='featmap').out_indices == (3, 7, 11, 16)
        assert WeightFormer(arch='t', out_type='avgpool').out_indices == (16, )
        assert WeightFormer(arch='t', out_type='featmap', out_indices=(-1, 5, 5)).out_indices \
            == (5, 16)


def test_invalid_options():
    with pytest.raises(ValueError, match='out_type'):
        WeightFormer(arch=MINI, out_type='cls_token')
    with pytest.raises(ValueError, match='out_indices'):
        WeightFormer(arch=MINI, out_indices=(0, 5))
    with pytest.raises(ValueError, match='out_indices'):
        WeightFormer(arch=MINI, out_indices=())
    with pytest.raises(ValueError, match=r"'pyramid' needs 1 or 4 out_indices"):
        WeightFormer(arch=MINI, out_type='pyramid', out_indices=(1, 4))
    with pytest.raises(ValueError, match='pyramid_cfg'):
        WeightFormer(arch=MINI, out_type='featmap', pyramid_cfg=dict(scales=(1, )))
    with pytest.raises(ValueError, match='frozen_stages'):
        WeightFormer(arch=MINI, frozen_stages=6)


def test_drop_path_linear_rule():
    with torch.device('meta'):
        model = WeightFormer(arch='tiny', drop_path_rate=0.2)
    assert isinstance(model.blocks[0].drop_path, nn.Identity)
    rates = [b.drop_path.drop_prob for b in model.blocks[1:]]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(0.2)
    assert rates[0] == pytest.approx(0.2 / 16)


# ------------------------------------------------------------------------------- forward
def expected_shapes(out_type: str, B: int, h: int, w: int, n_out: int = 4):
    """Output shapes for an input of h x w pixels with a 192-channel trunk."""
    gh, gw = -(-h // 16), -(-w // 16)
    if out_type == 'avgpool':
        return [(B, 192)]
    if out_type == 'featmap':
        return [(B, 192, gh, gw)] * n_out
    return [(B, 192, 4 * gh, 4 * gw), (B, 192, 2 * gh, 2 * gw), (B, 192, gh, gw),
            (B, 192, -(-gh // 2), -(-gw // 2))]


@pytest.mark.parametrize('hw', [(32, 32), (64, 96), (81, 113), (16, 48)],
                         ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('out_type', OUT_TYPES)
def test_output_shapes(tiny_models, out_type, hw):
    with torch.no_grad():
        outs = tiny_models[out_type](torch.randn(2, 3, *hw))
    assert isinstance(outs, tuple)
    assert [tuple(o.shape) for o in outs] == expected_shapes(out_type, 2, *hw)
    assert all(torch.isfinite(o).all() for o in outs)


def test_padding_equals_explicit_zero_pad(tiny_models):
    model = tiny_models['featmap']
    x = torch.randn(1, 3, 81, 113)
    with torch.no_grad():
        a = model(x)
        b = model(F.pad(x, (0, 128 - 113, 0, 96 - 81)))
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)


def test_avgpool_is_mean_of_final_featmap(tiny_models):
    """'avgpool' = the official head input: final norm, then the token mean."""
    feat, pool = tiny_models['featmap'], tiny_models['avgpool']
    pool.load_state_dict({k: v for k, v in feat.state_dict().items()
                          if k in pool.state_dict()}, strict=True)
    x = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(pool(x)[0], feat(x)[-1].mean(dim=(2, 3)))


def test_pyramid_from_one_block():
    model = WeightFormer(arch=MINI, out_indices=(-1, )).eval()
    assert model.out_indices == (4, )
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 80))
    assert [tuple(o.shape[-2:]) for o in outs] == [(16, 20), (8, 10), (4, 5), (2, 3)]


def test_dynamic_linear_non_square_grid():
    """Row-major pooling of an H x W grid (odd side floored), then the official formula."""
    torch.manual_seed(0)
    lin = DynamicLinear(8, 16)
    for p in lin.parameters():
        nn.init.normal_(p, std=0.5)
    H, W = 3, 5
    x = torch.randn(2, H * W, 8)
    y = lin(x, (H, W))
    grid = x.reshape(2, H, W, 8)
    pooled = torch.stack([grid[:, 2 * a:2 * a + 2, 2 * b:2 * b + 2].mean(dim=(1, 2))
                          for a in range(H // 2) for b in range(W // 2)], dim=1)  # [2, 2, 8]
    a_in, a_out = lin.token_proj(pooled).split([2, 4], dim=-1)
    dw = (F.silu(a_in) @ lin.in_basis).transpose(1, 2) @ (F.silu(a_out) @ lin.out_basis)
    dw = dw * 8**-0.5 / (H * W)  # [2, in, out]
    dw = dw / (dw.norm(dim=1, keepdim=True) + 1)
    ref = torch.einsum('bni,bio->bno', x, dw + lin.weight.t()) + lin.bias
    torch.testing.assert_close(y, ref)
    assert lin(torch.randn(1, 4, 8), (1, 4)).shape == (1, 4, 16)  # a side of 1 still runs



def test_dynamic_linear_follows_autocast():
    """Under bf16 autocast the layer returns bf16, as nn.Linear does (its bias is added in the
    product's dtype: no fp32 map for the MLP to cast back), within 2e-2 of the fp32 peak
    (measured ~5e-3)."""
    torch.manual_seed(0)
    lin = DynamicLinear(32, 64)
    x = torch.randn(2, 8 * 6, 32)
    with torch.no_grad():
        ref = lin(x, (8, 6))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = lin(x, (8, 6))
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max()

def test_dynamic_dwconv_per_sample_kernels():
    torch.manual_seed(0)
    conv = DynamicDWConv(6)
    x = torch.randn(3, 6, 7, 5)
    y = conv(x)
    for b in range(3):  # one sample at a time, its own kernel
        k = conv.kernel_gen(F.adaptive_avg_pool2d(x[b:b + 1], 3))[0].unsqueeze(1)
        k = k / (k.flatten(1).norm(dim=1).view(6, 1, 1, 1) + 1) + conv.weight
        ref = F.conv2d(x[b:b + 1], k, conv.bias, padding=1, groups=6)
        torch.testing.assert_close(y[b:b + 1], ref)


def test_dynamic_layers_call_the_ops(monkeypatch):
    """DynamicLinear and DynamicDWConv go through the public ops with their backend."""
    import mmeffattn.models.backbones.weightformer as wf_mod
    calls = []
    for name in ('dynamic_weight', 'dynamic_dwconv'):
        real = getattr(wf_mod, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, kwargs.get('backend')))
            return _real(*args, **kwargs)

        monkeypatch.setattr(wf_mod, name, spy)
    model = WeightFormer(arch=MINI, out_type='featmap', out_indices=(4, ),
                         attn_backend='reference').eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 32))
    # dynamic blocks 1 and 4
    assert calls == [('dynamic_dwconv', 'reference'), ('dynamic_weight', 'reference')] * 2


def test_triton_backend_matches_reference(monkeypatch):
    """The dynamic layers through the Triton kernels (compiled on GPU, interpreted on CPU),
    forward and backward, against the reference on the same weights."""
    from mmeffattn.ops.dynamic_dwconv.op import dynamic_dwconv_triton_reasons
    from mmeffattn.ops.dynamic_weight.op import dynamic_weight_triton_reasons

    probe = torch.zeros(1, 1, 16)
    reasons = (dynamic_weight_triton_reasons(probe, probe)
               + dynamic_dwconv_triton_reasons(probe.view(1, 1, 4, 4), probe.view(1, 1, 4, 4)))
    if reasons:
        pytest.skip('Triton backend unavailable: ' + '; '.join(reasons))
    monkeypatch.delenv('MMEFFATTN_OPS_BACKEND')
    torch.manual_seed(0)
    ref = WeightFormer(arch=dict(embed_dims=32, depth=2), out_type='featmap').train()
    tri = copy.deepcopy(ref)
    for m in tri.modules():
        if isinstance(m, (DynamicLinear, DynamicDWConv)):
            m.backend = 'triton'
    for m in ref.modules():
        if isinstance(m, (DynamicLinear, DynamicDWConv)):
            m.backend = 'reference'
    x = torch.randn(2, 3, 80, 48)  # a 5 x 3 token grid: odd sides, pooled to 2 x 1
    outs_ref, outs_tri = ref(x), tri(x)
    for a, b in zip(outs_ref, outs_tri):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    sum(o.square().mean() for o in outs_ref).backward()
    sum(o.square().mean() for o in outs_tri).backward()
    grads_tri = dict(tri.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads_tri[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------- pyramid layer
@pytest.mark.parametrize('hw', [(6, 5), (7, 7), (8, 6), (1, 3)])
def test_pyramid_half_level_is_a_ceil_mode_max_pool(hw):
    x = torch.randn(2, 3, *hw)
    torch.testing.assert_close(CeilMaxPool2d(2)(x),
                               torch.nn.MaxPool2d(2, 2, ceil_mode=True)(x), rtol=0, atol=0)


@pytest.mark.parametrize('cls', ['WeightFormer', 'VECA'])
def test_pyramid_exports_with_symbolic_sizes(cls):
    """torch.export with a dynamic height and width: a ceil-mode pool for the half-size level
    made the exporter guard on its output size ("Constraints violated")."""
    from mmeffattn.models import VECA
    model = (WeightFormer(arch=dict(embed_dims=32, depth=2), out_type='pyramid', out_indices=-1)
             if cls == 'WeightFormer' else
             VECA(arch=dict(embed_dims=64, depth=2, num_heads=2), out_type='pyramid',
                  out_indices=-1, num_cores=8)).eval()
    Dim = torch.export.Dim
    ep = torch.export.export(model, (torch.randn(1, 3, 64, 96), ), strict=False,
                             dynamic_shapes=({2: Dim('h', min=64, max=4096),
                                              3: Dim('w', min=64, max=4096)}, ))
    x = torch.randn(1, 3, 80, 112)  # another size, with a partial last cell at the half level
    with torch.no_grad():
        for got, want in zip(ep.module()(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_vit_pyramid_levels_and_errors():
    pyr = ViTPyramid(16)
    assert pyr.num_levels == 4 and len(pyr.norms) == 4
    assert isinstance(pyr.levels[2], nn.Identity) and isinstance(pyr.levels[3], CeilMaxPool2d)
    assert [type(m).__name__ for m in pyr.levels[0]] == [
        'ConvTranspose2d', 'LayerNorm2d', 'GELU', 'ConvTranspose2d']
    feats = [torch.randn(2, 16, 5, 3) for _ in range(4)]
    assert [tuple(o.shape) for o in pyr(feats)] == [(2, 16, 20, 12), (2, 16, 10, 6),
                                                    (2, 16, 5, 3), (2, 16, 3, 2)]
    with pytest.raises(ValueError, match='takes 1 or 4 maps'):
        pyr(feats[:2])
    with pytest.raises(ValueError, match=r'\[B, 16, H, W\]'):
        pyr([torch.randn(2, 8, 5, 3)])
    with pytest.raises(ValueError, match='powers of two'):
        ViTPyramid(16, scales=(3, 1))
    bn = ViTPyramid(16, scales=(8, 1, .25), norm_cfg=dict(type='BN'), out_norm=False)
    assert bn.norms is None
    assert [tuple(o.shape[-2:]) for o in bn([torch.randn(2, 16, 4, 4)])] == [(32, 32), (4, 4),
                                                                             (1, 1)]


# ------------------------------------------------------------------------------- training modes


# ------------------------------------------------------------------------------- converter
@pytest.fixture(scope='module')
def official_tiny():
    return fake_official_state_dict(192, 17)


@pytest.mark.parametrize('size', [32, 48, 64])
def test_converted_classifier_matches_official_oracle(official_tiny, size):
    """Official weights -> convert -> strict load into mmpretrain's ImageClassifier: same logits.

    32 and 64 give 2x2 and 4x4 grids; 48 a 3x3 grid whose last row/column the 2x2 pooling drops.
    """
    clf = build_classifier('tiny').eval()
    converted = checkpoint_filter_weightformer_official({'model': official_tiny, 'epoch': 299})
    clf.load_state_dict(converted, strict=True)
    torch.manual_seed(size)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        logits = clf(x, mode='tensor')
        ref = official_forward_oracle(official_tiny, x, depth=17)
    assert logits.shape == (2, 1000)
    assert ref.std() > 0.1  # not a degenerate comparison
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


def test_oracle_sees_the_dynamic_terms(official_tiny):
    """The oracle comparison would catch a dropped or mis-normalized dynamic weight."""
    x = torch.randn(1, 3, 64, 64)
    broken = dict(official_tiny)
    for i in (1, 4, 7, 10, 13, 16):
        broken[f'blocks.{i}.linear1.w2'] = torch.zeros_like(broken[f'blocks.{i}.linear1.w2'])
    with torch.no_grad():
        a = official_forward_oracle(official_tiny, x, 17)
        b = official_forward_oracle(broken, x, 17)
    assert (a - b).abs().max() > 1e-2


def test_convert_is_pure_and_strict(official_tiny):
    sd = {'module.' + k: v for k, v in official_tiny.items()}
    orig = dict(sd)
    out = checkpoint_filter_weightformer_official(sd)
    assert sd == orig
    assert out['backbone.norm16.weight'] is orig['module.norm.weight']
    assert torch.equal(out['backbone.blocks.1.mlp.fc1.weight'],
                       orig['module.blocks.1.linear1.w'].t())
    assert set(k.split('.')[0] for k in out) == {'backbone', 'head'}
    with pytest.raises(ValueError, match=r"keys of no official WeightFormer module.*'pos_embed'"):
        checkpoint_filter_weightformer_official({**official_tiny, 'pos_embed': torch.zeros(1)})
    with pytest.raises(ValueError, match='no blocks'):
        checkpoint_filter_weightformer_official({'head.weight': torch.zeros(1)})


def test_converter_cli_reads_official_training_checkpoint(tmp_path, monkeypatch, official_tiny):
    """A checkpoint as the official main.py saves it, with its yacs CfgNode under 'config',
    converts without yacs installed and loads into the classifier via mmengine."""
    from mmengine.runner import load_checkpoint

    yacs, yacs_config = types.ModuleType('yacs'), types.ModuleType('yacs.config')
    CfgNode = type('CfgNode', (dict, ), {'__module__': 'yacs.config'})
    yacs_config.CfgNode = CfgNode
    cfg = CfgNode(MODEL=CfgNode(NAME='wfm_tiny', DROP_PATH_RATE=0.0), AMP=True)
    cfg.__dict__['__immutable__'] = True
    cfg['MODEL'].__dict__['__immutable__'] = True
    monkeypatch.setitem(sys.modules, 'yacs', yacs)
    monkeypatch.setitem(sys.modules, 'yacs.config', yacs_config)
    src, dst = tmp_path / 'wfm-t.pth', tmp_path / 'wfm-t_mmpretrain.pth'
    torch.save({'model': official_tiny, 'optimizer': {'state': {}, 'param_groups': []},
                'lr_scheduler': {}, 'max_accuracy': 75.0, 'epoch': 299, 'config': cfg}, src)
    monkeypatch.delitem(sys.modules, 'yacs.config')
    monkeypatch.delitem(sys.modules, 'yacs')

    meta = converter_cli.main([str(src), str(dst)])
    assert meta['arch'] == 'tiny' and meta['epoch'] == 299
    saved = torch.load(dst, weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    clf = build_classifier('tiny')
    load_checkpoint(clf, str(dst), map_location='cpu', strict=True)
    for k, v in checkpoint_filter_weightformer_official(official_tiny).items():
        assert torch.equal(clf.state_dict()[k], v), k


# ------------------------------------------------------------------------------- weights
def test_backbone_loads_official_checkpoint_for_dense_prediction(tmp_path, official_tiny):
    path = tmp_path / 'wfm-t.pth'
    torch.save({'model': official_tiny}, path)
    model = WeightFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    norm3 = model.norm3.weight.clone()
    pyr = copy.deepcopy(model.pyramid.state_dict())
    model.init_weights()
    own = model.state_dict()
    assert torch.equal(own['norm16.weight'], official_tiny['norm.weight'])
    assert torch.equal(own['blocks.4.dwc.kernel_gen.2.weight'],
                       official_tiny['blocks.4.dwc.wfm.2.weight'])
    assert torch.equal(own['norm3.weight'], norm3)  # no such norm in the checkpoint: kept
    assert all(torch.equal(v, own['pyramid.' + k]) for k, v in pyr.items())


def test_backbone_loads_converted_classifier_with_prefix(tmp_path, official_tiny):
    path = tmp_path / 'cls.pth'
    torch.save({'state_dict': checkpoint_filter_weightformer_official(official_tiny),
                'meta': {}}, path)
    model = WeightFormer(arch='tiny', out_type='avgpool',
                         init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='backbone.'))
    model.init_weights()
    assert torch.equal(model.blocks[1].mlp.fc1.weight, official_tiny['blocks.1.linear1.w'].t())
    model = WeightFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r"lie under 'backbone\.'.*prefix='backbone\.'"):
        model.init_weights()


def test_pretrained_mismatch_names_keys(tmp_path, official_tiny):
    path = tmp_path / 'wfm-t.pth'
    sd = dict(official_tiny)
    del sd['blocks.2.linear1.weight']
    torch.save({'model': sd}, path)
    model = WeightFormer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r"missing keys \['blocks\.2\.mlp\.fc1\.weight'\]"):
        model.init_weights()
    torch.save({'model': official_tiny}, path)
    model = WeightFormer(arch='small', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r'patch_embed\.proj\.weight: checkpoint '
                                           r'\(192, 3, 16, 16\) vs model \(384, 3, 16, 16\)'):
        model.init_weights()


def test_checkpoint_filter_passes_our_keys_through():
    sd = {'module.blocks.0.dwc.weight': torch.zeros(1), 'norm16.bias': torch.zeros(1)}
    assert checkpoint_filter_weightformer({'state_dict': sd}).keys() == {'blocks.0.dwc.weight',
                                                                        'norm16.bias'}


def test_default_init():
    model = WeightFormer(arch=MINI)
    fc1 = model.blocks[1].mlp.fc1
    assert 0.01 < fc1.weight.std() < 0.03 and 0.01 < fc1.in_basis.std() < 0.03
    assert fc1.token_proj.bias.abs().max() == 0
    assert torch.all(model.blocks[1].norm1.weight == 1)


# ------------------------------------------------------------------------------- registries
def test_build_from_registries():
    from mmdet.registry import MODELS as DET_MODELS
    from mmpretrain.registry import MODELS as CLS_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    with torch.device('meta'):
        model = MODELS.build(dict(type='mmeffattn.WeightFormer', arch='tiny'))
        det = DET_MODELS.build(dict(type='mmeffattn.WeightFormer', arch='small'))
        seg = SEG_MODELS.build(dict(type='mmeffattn.WeightFormer', arch='tiny',
                                    out_indices=(2, 5, 8, 11)))
        cls = CLS_MODELS.build(dict(type='mmeffattn.WeightFormer', arch='tiny',
                                    out_type='avgpool'))
    assert isinstance(model, WeightFormer) and model.out_type == 'pyramid'
    assert isinstance(det, WeightFormer) and det.embed_dims == 384
    assert seg.out_indices == (2, 5, 8, 11) and cls.out_indices == (16, )
    clf = build_classifier(MINI)
    with torch.no_grad():
        assert clf(torch.randn(1, 3, 32, 32), mode='tensor').shape == (1, 1000)


def test_attn_backend_reaches_the_dynamic_ops():
    model = WeightFormer(arch=MINI, attn_backend='reference')
    dynamic = [m for m in model.modules() if isinstance(m, (DynamicLinear, DynamicDWConv))]
    assert dynamic and all(m.backend == 'reference' for m in dynamic)
    assert all(m.backend is None for m in WeightFormer(arch=MINI).modules()
               if isinstance(m, (DynamicLinear, DynamicDWConv)))
