"""Tests of the official VECA checkpoint converter (tools/model_converters/veca_official.py over
:func:`mmeffattn.models.converters.convert_official`, and
:func:`mmeffattn.models.backbones.veca.checkpoint_filter_veca_official`).

The official model (alansong1322/VECA, veca/model.py) is never imported or copied here. The
test-only oracles below are written from reading it: the list of its state-dict keys and shapes
per family, and a functional forward pass over an official-keyed state dict. The oracle computes
the block-sparse attention as ONE masked attention over all tokens (the official code and our op
split it in two), so an error in either split would show.
"""
import math
import os.path as osp
from collections import OrderedDict
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.backbones.veca import (VECA, checkpoint_filter_veca,
                                             checkpoint_filter_veca_official)
from tools.model_converters import veca_official as converter_cli

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

# veca/config.py FAMILY_PRESETS: (hidden_dim, num_layers, num_heads, mlp_ratio)
OFFICIAL_FAMILIES = {'small': (384, 12, 6, 2.66667), 'splus': (384, 12, 6, 4.0),
                     'base': (768, 12, 12, 2.66667), 'large': (1024, 24, 16, 2.66667)}


# ------------------------------------------------------------------------------- oracles
def official_shapes(family: str, patch_ln: bool = False, out_dim: Optional[int] = None,
                    queries: int = 64, chunk: int = 8, patch: int = 16,
                    in_chans: int = 3) -> 'OrderedDict[str, tuple]':
    """Every state-dict key of the official ``VECA`` module with its shape (read from
    veca/model.py): chunked query tokens [1, chunk, D] and coordinates [1, chunk, 2], one
    ``pos_linears`` Linear(D, 2) per layer but the first, ``pos_alpha`` [L - 1], QueryBlocks
    (norm_attn, attn.{q,k,v,out}_proj, norm_ffn, fc1 D -> 2h, fc2 h -> D), final_norm, and
    output_proj when ``distill_output_dim`` differs from D. ``rope.periods`` is not persistent."""
    D, L, _, ratio = OFFICIAL_FAMILIES[family]
    h = int(D * ratio)
    s = OrderedDict()
    s['patch_embed.proj.weight'] = (D, in_chans, patch, patch)
    s['patch_embed.proj.bias'] = (D, )
    if patch_ln:
        s['patch_embed.norm.weight'] = s['patch_embed.norm.bias'] = (D, )
    for c in range(queries // chunk):
        s[f'query_token_chunks.{c}'] = (1, chunk, D)
    for c in range(queries // chunk):
        s[f'qcoord_chunks.{c}'] = (1, chunk, 2)
    for j in range(L - 1):
        s[f'pos_linears.{j}.weight'] = (2, D)
        s[f'pos_linears.{j}.bias'] = (2, )
    s['pos_alpha'] = (L - 1, )
    for i in range(L):
        p = f'blocks.{i}.'
        s[p + 'norm_attn.weight'] = s[p + 'norm_attn.bias'] = (D, )
        for name in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            s[p + f'attn.{name}.weight'] = (D, D)
            s[p + f'attn.{name}.bias'] = (D, )
        s[p + 'norm_ffn.weight'] = s[p + 'norm_ffn.bias'] = (D, )
        s[p + 'fc1.weight'] = (2 * h, D)
        s[p + 'fc1.bias'] = (2 * h, )
        s[p + 'fc2.weight'] = (D, h)
        s[p + 'fc2.bias'] = (D, )
    s['final_norm.weight'] = s['final_norm.bias'] = (D, )
    if out_dim is not None and out_dim != D:
        s['output_proj.weight'] = (out_dim, D)
        s['output_proj.bias'] = (out_dim, )
    return s


def fake_official_state_dict(family: str, patch_ln: bool = False, out_dim: Optional[int] = None,
                             seed: int = 0) -> 'OrderedDict[str, torch.Tensor]':
    """Random official-keyed weights, scaled so that the RoPE, the coordinate updates and every
    core visibly matter."""
    g = torch.Generator().manual_seed(seed)
    sd = OrderedDict()
    for k, shape in official_shapes(family, patch_ln, out_dim).items():
        if 'norm' in k and k.endswith('weight'):
            t = 1 + 0.2 * torch.randn(shape, generator=g)
        elif k.startswith('query_token_chunks'):
            t = torch.randn(shape, generator=g)
        elif k.startswith('qcoord_chunks'):
            t = 0.7 * torch.randn(shape, generator=g)
        elif k == 'pos_alpha':
            t = 0.1 + 0.02 * torch.randn(shape, generator=g)
        elif k.startswith('pos_linears'):
            t = 0.1 * torch.randn(shape, generator=g)
        elif 'attn.q_proj' in k or 'attn.k_proj' in k:
            t = 0.1 * torch.randn(shape, generator=g)  # sharp attention: positions matter
        else:
            t = 0.05 * torch.randn(shape, generator=g)
        sd[k] = t
    return sd


def official_forward_oracle(sd: dict, images: torch.Tensor, num_heads: int,
                            k: int) -> 'tuple[torch.Tensor, torch.Tensor]':
    """The official ``VECA.forward(images, active_k=k)`` in eval mode, re-derived functionally.

    Inputs with sides divisible by 16 only (the official patch convolution floors)."""
    D = sd['patch_embed.proj.weight'].shape[0]
    L = sd['pos_alpha'].numel() + 1
    hd = D // num_heads
    B = images.shape[0]

    def ln(t, name):
        return F.layer_norm(t, (D, ), sd[name + '.weight'], sd[name + '.bias'])

    def lin(t, name):
        return t @ sd[name + '.weight'].t() + sd[name + '.bias']

    fm = F.conv2d(images, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=16)
    Hp, Wp = fm.shape[-2:]
    patches = fm.flatten(2).transpose(1, 2)  # [B, N, D]
    if 'patch_embed.norm.weight' in sd:
        patches = ln(patches, 'patch_embed.norm')
    N = Hp * Wp
    n = k // sd['query_token_chunks.0'].shape[1]
    cores = torch.cat([sd[f'query_token_chunks.{c}'] for c in range(n)], 1).repeat(B, 1, 1)
    raw = torch.cat([sd[f'qcoord_chunks.{c}'] for c in range(n)], 1).repeat(B, 1, 1)
    # patch positions: cell centres mapped to [-1, 1] (fp32 (i + .5) / n * 2 - 1 as the
    # official grid), (x, y), row-major
    cx = (torch.arange(Wp, dtype=torch.float32) + .5) / Wp * 2 - 1
    cy = (torch.arange(Hp, dtype=torch.float32) + .5) / Hp * 2 - 1
    patch_xy = torch.stack([cx.repeat(Hp), cy.repeat_interleave(Wp)], -1)  # [N, 2]
    patch_xy = patch_xy.unsqueeze(0).repeat(B, 1, 1).to(images.dtype)  # [B, N, 2]
    # periods base**(2j / (hd/2)), the last round(hd/4 / 8) (lowest frequencies) switched off
    # (fp32 angles (2 pi c) / period, as the official cos_sin)
    nf = hd // 4
    periods = 100 ** (2 * torch.arange(nf, dtype=torch.float32) / (hd // 2))
    periods[nf - int(round(nf * 0.125)):] = float('inf')
    # the attention pattern: core rows see every key, patch rows the k cores only
    allowed = torch.zeros(k + N, k + N, dtype=torch.bool)
    allowed[:k] = True
    allowed[:, :k] = True
    x = torch.cat([cores, patches], 1)
    for i in range(L):
        if i:
            raw = raw + sd['pos_alpha'][i - 1] * lin(x[:, :k], f'pos_linears.{i - 1}')
        xy = torch.cat([torch.tanh(raw), patch_xy], 1).float()  # [B, k + N, 2]
        ang = torch.cat([(2 * math.pi * xy[..., :1] / periods).repeat_interleave(2, -1),
                         (2 * math.pi * xy[..., 1:] / periods).repeat_interleave(2, -1)],
                        -1)  # [B, k + N, hd]
        cos, sin = ang.cos()[:, None].to(x.dtype), ang.sin()[:, None].to(x.dtype)

        def rot(t):  # pairs (a, b) -> (-b, a)
            out = torch.empty_like(t)
            out[..., 0::2] = -t[..., 1::2]
            out[..., 1::2] = t[..., 0::2]
            return out

        p = f'blocks.{i}.'
        h = ln(x, p + 'norm_attn')
        q, kk, v = (lin(h, p + f'attn.{nm}_proj').view(B, k + N, num_heads, hd).transpose(1, 2)
                    for nm in 'qkv')
        q, kk = q * cos + rot(q) * sin, kk * cos + rot(kk) * sin
        logits = (q @ kk.transpose(-1, -2)) / math.sqrt(hd)
        att = logits.masked_fill(~allowed, float('-inf')).softmax(-1) @ v
        x = x + lin(att.transpose(1, 2).reshape(B, k + N, D), p + 'attn.out_proj')
        u, g = lin(ln(x, p + 'norm_ffn'), p + 'fc1').chunk(2, -1)
        x = x + lin(F.silu(u) * g, p + 'fc2')
    x = ln(x, 'final_norm')
    if 'output_proj.weight' in sd:
        x = lin(x, 'output_proj')
    return x[:, 0], x[:, k:]


def build_raw(family: str, **kwargs) -> VECA:
    return VECA(arch=family, out_type='raw', **kwargs).eval()


# ------------------------------------------------------------------------------- tests
@pytest.fixture(scope='module')
def official_small():
    return fake_official_state_dict('small', out_dim=768)  # VECA-S distilled from a ViT-B


@pytest.fixture(scope='module')
def converted_small(official_small):
    model = build_raw('small', out_proj_dims=768)
    model.load_state_dict(checkpoint_filter_veca({'student': official_small}), strict=True)
    return model


@pytest.mark.parametrize('cores', [8, 16, 64])
def test_converted_matches_official_oracle(official_small, converted_small, cores):
    """Official weights -> convert -> strict load: the official outputs for each core budget."""
    torch.manual_seed(cores)
    x = torch.randn(2, 3, 64, 48)  # 4 x 3 patches: fewer patches than cores at C = 64
    converted_small.num_cores = cores
    with torch.no_grad():
        g, p = converted_small(x)
        g_ref, p_ref = official_forward_oracle(official_small, x, num_heads=6, k=cores)
    assert g.shape == (2, 768) and p.shape == (2, 12, 768)
    assert g_ref.std() > 0.1 and p_ref.std() > 0.1  # not a degenerate comparison
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=1e-4)


def test_oracle_sees_cores_coordinates_and_rope(official_small):
    """The comparison would catch a wrong budget, a dropped coordinate update or a RoPE on the
    wrong positions: each changes the oracle's own output clearly."""
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        base = official_forward_oracle(official_small, x, 6, 16)
        fewer = official_forward_oracle(official_small, x, 6, 8)
        still = dict(official_small, pos_alpha=torch.zeros(11))
        no_move = official_forward_oracle(still, x, 6, 16)
        moved = dict(official_small)
        moved['qcoord_chunks.0'] = moved['qcoord_chunks.0'] + 1.0
        shifted = official_forward_oracle(moved, x, 6, 16)
    for other in (fewer, no_move, shifted):
        assert (base[1] - other[1]).abs().max() > 1e-2


def test_patch_ln_variant_and_splus(tmp_path):
    """The official patch_embed_use_ln=True layout and the splus family convert too."""
    sd = fake_official_state_dict('splus', patch_ln=True, seed=1)
    model = build_raw('splus', patch_norm=True, num_cores=24)
    model.load_state_dict(checkpoint_filter_veca(sd), strict=True)
    x = torch.randn(1, 3, 32, 64)
    with torch.no_grad():
        g, p = model(x)
        g_ref, p_ref = official_forward_oracle(sd, x, 6, 24)
    torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('family', list(OFFICIAL_FAMILIES))
def test_keys_and_shapes_of_every_family(family):
    """Converted official keys = our keys, shape for shape, for every family (meta build)."""
    official = official_shapes(family, out_dim=768)
    converted = checkpoint_filter_veca_official(
        {k: torch.empty(s, device='meta') for k, s in official.items()})
    with torch.device('meta'):
        model = VECA(arch=family, out_proj_dims=768)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {k[len('backbone.'):]: tuple(v.shape) for k, v in converted.items()} == ours


def test_convert_is_pure_and_strict(official_small):
    sd = {'module.' + k: v for k, v in official_small.items()}
    orig = dict(sd)
    out = checkpoint_filter_veca_official(sd)
    assert sd == orig
    assert out['backbone.norm11.weight'] is orig['module.final_norm.weight']
    assert out['backbone.blocks.3.attn.proj.bias'] is orig['module.blocks.3.attn.out_proj.bias']
    assert out['backbone.blocks.5.coord_head.alpha'] == orig['module.pos_alpha'][4]
    assert out['backbone.blocks.5.coord_head.fc.weight'] is orig['module.pos_linears.4.weight']
    assert out['backbone.core_coords.7'] is orig['module.qcoord_chunks.7']
    assert all(k.startswith('backbone.') for k in out)
    with pytest.raises(ValueError, match=r"keys of no official VECA module.*'cls_token'"):
        checkpoint_filter_veca_official({**official_small, 'cls_token': torch.zeros(1)})
    with pytest.raises(ValueError, match='Not an official VECA state dict'):
        checkpoint_filter_veca_official({'blocks.0.fc1.weight': torch.zeros(1)})
    bad = dict(official_small, pos_alpha=torch.zeros(5))
    with pytest.raises(ValueError, match='pos_alpha has 5 entries for 12 blocks'):
        checkpoint_filter_veca_official(bad)


def official_training_checkpoint(sd: dict, family: str, out_dim: Optional[int]) -> dict:
    """What veca/checkpoint.py save_ckpt writes: the student, two optimizers, two schedulers,
    the config as a plain dict (cfg_to_dict) and extras."""
    D, L, H, ratio = OFFICIAL_FAMILIES[family]
    cfg = dict(model_family=family, num_query_tokens=64, hidden_dim=D, num_heads=H,
               num_layers=L, mlp_ratio=ratio, patch_embed_use_ln=False, nested_chunk_size=8,
               nested_budgets=(8, 16, 24, 32, 40, 48, 56, 64), distill_output_dim=out_dim,
               resize_short_by_res={256: 288})
    return {'student': sd, 'optimizer': {'state': {}, 'param_groups': []},
            'optimizer_muon': {'state': {}, 'param_groups': []}, 'scheduler': {},
            'scheduler_muon': {}, 'config': cfg, 'epoch': 134, 'best_val': 0.5}


def test_converter_cli_reads_official_training_checkpoint(tmp_path, official_small):
    """A checkpoint as the official training saves it converts with the safe loader; the result
    loads strictly into the backbone named in its meta and, via the configs' prefix, into a
    downstream backbone (the distillation projection ignored)."""
    from mmengine.runner import load_checkpoint

    src, dst = tmp_path / 'veca_s.pt', tmp_path / 'veca-s_mmeffattn.pth'
    torch.save(official_training_checkpoint(official_small, 'small', 768), src)
    meta = converter_cli.main([str(src), str(dst)])
    assert meta['backbone'] == dict(type='mmeffattn.VECA', arch='small', out_type='raw',
                                    max_cores=64, core_chunk=8, patch_norm=False,
                                    out_proj_dims=768)
    assert meta['epoch'] == 134
    saved = torch.load(dst, weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    model = VECA(**{k: v for k, v in meta['backbone'].items() if k != 'type'})
    load_checkpoint(model, str(dst), map_location='cpu', strict=True, revise_keys=[
        (r'^backbone\.', '')])
    for k, v in checkpoint_filter_veca_official(official_small).items():
        assert torch.equal(model.state_dict()[k[len('backbone.'):]], v), k

    dense = VECA(arch='small', out_type='featmap',
                 init_cfg=dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.'))
    dense.init_weights()
    assert torch.equal(dense.norm11.weight, official_small['final_norm.weight'])
    assert torch.equal(dense.blocks[0].ffn.fc1.weight, official_small['blocks.0.fc1.weight'])


def test_backbone_loads_official_checkpoint_directly(tmp_path, official_small):
    """init_cfg can point at the official file itself (weights under 'student', no prefix)."""
    path = tmp_path / 'veca_s.pt'
    torch.save(official_training_checkpoint(official_small, 'small', 768), path)
    model = VECA(arch='small', out_proj_dims=768,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert torch.equal(model.output_proj.weight, official_small['output_proj.weight'])
    assert torch.equal(model.core_tokens[3], official_small['query_token_chunks.3'])
    # the distilled checkpoint has output_proj: a model that needs it cannot silently miss it
    torch.save({'student': {k: v for k, v in official_small.items()
                            if not k.startswith('output_proj')}}, path)
    model = VECA(arch='small', out_proj_dims=768,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r"missing keys \['output_proj\.weight'"):
        model.init_weights()


def test_cli_custom_family_needs_heads(tmp_path):
    """Weights of no official family: the head count comes from the checkpoint config."""
    sd = fake_official_state_dict('small')
    src, dst = tmp_path / 'x.pt', tmp_path / 'y.pth'
    shrunk = {k: v for k, v in sd.items()
              if not k.startswith(('blocks.10.', 'blocks.11.', 'pos_linears.9.',
                                   'pos_linears.10.'))}
    shrunk['pos_alpha'] = sd['pos_alpha'][:9]
    with pytest.raises(ValueError, match=r'pos_linears.*0 \.\. 8 \(10 blocks\)'):
        checkpoint_filter_veca_official({**shrunk, 'pos_linears.9.weight': torch.zeros(2, 384)})
    torch.save({'student': shrunk}, src)
    with pytest.raises(ValueError, match='no num_heads in the checkpoint config'):
        converter_cli.main([str(src), str(dst)])
    torch.save({'student': shrunk, 'config': dict(num_heads=6, mlp_ratio=2.66667)}, src)
    meta = converter_cli.main([str(src), str(dst)])
    assert meta['backbone']['arch'] == dict(embed_dims=384, depth=10, num_heads=6,
                                            mlp_ratio=2.66667)
    model = VECA(**{k: v for k, v in meta['backbone'].items() if k != 'type'})
    model.load_state_dict({k[len('backbone.'):]: v
                           for k, v in torch.load(dst)['state_dict'].items()}, strict=True)
    with pytest.raises(FileNotFoundError, match='absent.pt.* does not exist'):
        converter_cli.main([str(tmp_path / 'absent.pt'), str(dst)])


def test_cli_converts_a_smaller_core_bank(tmp_path):
    """A bank of 32 cores (4 chunks): the converted backbone builds with its defaults (all 32
    active) and loads strictly; before, num_cores defaulted to 64 and the build failed."""
    sd = {k: v for k, v in fake_official_state_dict('small').items()
          if not k.startswith(tuple(f'{p}.{c}' for p in ('query_token_chunks', 'qcoord_chunks')
                                    for c in range(4, 8)))}
    src, dst = tmp_path / 'x.pt', tmp_path / 'y.pth'
    torch.save({'student': sd}, src)
    meta = converter_cli.main([str(src), str(dst)])
    assert meta['backbone']['max_cores'] == 32
    model = VECA(**{k: v for k, v in meta['backbone'].items() if k != 'type'})
    assert model.num_cores == 32
    model.load_state_dict({k[len('backbone.'):]: v
                           for k, v in torch.load(dst)['state_dict'].items()}, strict=True)


def test_cli_names_a_file_that_is_no_checkpoint(tmp_path):
    src = tmp_path / 'notes.pt'
    src.write_text('not a checkpoint')
    with pytest.raises(RuntimeError, match=r"notes.pt' is corrupt.*saved with torch.save"):
        converter_cli.main([str(src), str(tmp_path / 'y.pth')])
