"""Tests of the VECA backbone (mmeffattn/models/backbones/veca.py).

The official architecture (alansong1322/VECA, veca/model.py + veca/config.py) enters only
through the test-only oracle of tests/models/test_veca_converter.py (its state-dict keys and shapes
per family, and its forward pass); nothing official is imported or copied.
"""
import json
import math
import os.path as osp
from collections import Counter

import pytest
import torch
import torch.nn as nn

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.backbones import veca as veca_mod
from mmeffattn.models.backbones.veca import (VECA, RoPE2D, farthest_point_sampling,
                                             fps_core_coords, patch_centres)
from mmeffattn.registry import MODELS
from test_veca_converter import OFFICIAL_FAMILIES, official_shapes  # same folder

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# A reduced arch for mechanism tests: head dim 32, three blocks (two coordinate updates).
pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

MINI = dict(embed_dims=64, depth=3, num_heads=2)
OUT_TYPES = ['raw', 'global', 'featmap', 'pyramid']


@pytest.fixture(scope='module')
def small_models():
    """One eval-mode VECA-S per out_type, shared by the tests that do not modify them."""
    torch.manual_seed(0)
    return {t: VECA(arch='small', out_type=t).eval() for t in OUT_TYPES}


@pytest.fixture
def op_calls(monkeypatch):
    """Record (num_cores, q shape) of every call of the attention op by the model."""
    calls = []
    real = veca_mod.core_periphery_attention

    def spy(q, k, v, num_cores, **kw):
        calls.append((num_cores, tuple(q.shape)))
        return real(q, k, v, num_cores, **kw)

    monkeypatch.setattr(veca_mod, 'core_periphery_attention', spy)
    return calls


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------- construction
@pytest.mark.parametrize('family', list(OFFICIAL_FAMILIES))
def test_param_count_matches_official(family):
    """Ours = the official module's parameters (its state dict: rope periods are a
    non-persistent buffer), without and with the distillation projection to 768."""
    for out_dim in (None, 768):
        with torch.device('meta'):
            model = VECA(arch=family, out_proj_dims=out_dim)
        official = sum(math.prod(s) for s in official_shapes(family, out_dim=out_dim).values())
        print(f'VECA-{family} (out_proj {out_dim}): ours {n_params(model):,} / official '
              f'{official:,}')
        assert n_params(model) == official
    D, L, H, _ = OFFICIAL_FAMILIES[family]
    assert (model.embed_dims, model.depth, model.patch_size) == (D, L, 16)
    assert model.blocks[0].attn.num_heads == H and model.rope.head_dim == D // H


def test_official_defaults():
    """The veca/config.py defaults: no patch-embed LN, RoPE base 100 with 1/8 of the periods
    (the longest) switched off, shift .08, no jitter, rescale 2, FPS pool 1000 in +-0.95."""
    model = VECA(arch=MINI)
    assert isinstance(model.patch_embed.norm, nn.Identity)
    r = model.rope
    assert (r.base, r.shift, r.jitter, r.rescale, r.p_zero_freqs) == (100., .08, None, 2., .125)
    periods = r.periods  # 8 periods for head dim 32: the last one is off
    assert torch.isinf(periods[-1]) and torch.isfinite(periods[:-1]).all()
    torch.testing.assert_close(periods[:-1], 100 ** (torch.arange(7) * 2 / 16.))
    assert model.blocks[0].coord_head is None
    assert all(float(b.coord_head.alpha.detach()) == pytest.approx(.01) for b in model.blocks[1:])
    assert model.budgets == (8, 16, 24, 32, 40, 48, 56, 64)
    assert model.budget_weights == (1, 1, 2, 2, 3, 3, 4, 4)
    assert model.num_cores == 64 and model.nested_dropout
    assert 'rope.periods' not in model.state_dict()


def test_default_init():
    torch.manual_seed(0)
    model = VECA(arch='small')
    fc1 = model.blocks[3].ffn.fc1
    assert 0.015 < fc1.weight.std() < 0.025 and fc1.bias.abs().max() == 0
    assert 0.015 < model.patch_embed.proj.weight.std() < 0.025
    assert model.patch_embed.proj.bias.abs().max() == 0
    bank = torch.cat(list(model.core_tokens), 1).detach()
    assert bank.shape == (1, 64, 384)
    assert float(bank.std()) == pytest.approx(384 ** -0.5, rel=0.1)  # N(0, 1/D)
    xy = torch.tanh(torch.cat(list(model.core_coords), 1))[0].detach()
    assert xy.abs().max() <= .95 + 1e-6


def test_fps_init_is_deterministic_and_spread():
    a, b = VECA(arch=MINI), VECA(arch=MINI)
    for pa, pb in zip(a.core_coords, b.core_coords):
        assert torch.equal(pa, pb)
    xy = torch.tanh(fps_core_coords(64))
    d = torch.cdist(xy, xy) + torch.eye(64) * 10
    g = torch.Generator().manual_seed(1)
    rnd = torch.rand(64, 2, generator=g) * 1.9 - .95
    d_rnd = torch.cdist(rnd, rnd) + torch.eye(64) * 10
    assert d.min() > 2 * d_rnd.min()  # far better spread than 64 random points
    assert not torch.equal(fps_core_coords(64, seed=1), fps_core_coords(64, seed=0))


def test_farthest_point_sampling_greedy_rule():
    pts = torch.tensor([[.9, .9], [.1, 0.], [-.5, .2], [.8, -.7], [0., .05], [-.9, -.9]])
    idx = farthest_point_sampling(pts, 4).tolist()
    # starts nearest the origin, then each pick maximises its distance to the chosen set
    assert idx[0] == 4
    for t in range(1, 4):
        dist = torch.cdist(pts, pts[idx[:t]]).min(1).values
        assert idx[t] == int(dist.argmax())
    assert farthest_point_sampling(pts, 10).tolist() == list(range(6))


def test_arch_aliases_custom_and_invalid():
    assert VECA._parse_arch('S') == VECA._parse_arch('small')
    assert VECA._parse_arch('b')['embed_dims'] == 768
    assert VECA._parse_arch(MINI)['mlp_ratio'] == pytest.approx(2.66667)
    with pytest.raises(KeyError, match=r"Unknown arch 'huge'.*'base'.*'large'.*'small'"):
        VECA(arch='huge')
    with pytest.raises(ValueError, match='num_heads'):
        VECA(arch=dict(embed_dims=64, depth=2))
    with pytest.raises(ValueError, match="arch 'depth' must be >= 1, got 0"):
        VECA(arch=dict(embed_dims=64, depth=0, num_heads=2))
    with pytest.raises(ValueError, match='divisible by num_heads'):
        VECA(arch=dict(embed_dims=64, depth=2, num_heads=3))
    with pytest.raises(ValueError, match='head dim divisible by 4, got 18'):
        VECA(arch=dict(embed_dims=36, depth=2, num_heads=2))


def test_invalid_options():
    with pytest.raises(ValueError, match='out_type'):
        VECA(arch=MINI, out_type='cls_token')
    with pytest.raises(ValueError, match=r"'raw' returns the last block only"):
        VECA(arch=MINI, out_type='raw', out_indices=(0, 2))
    assert VECA(arch=MINI, out_type='raw', out_indices=-1).out_indices == (2, )
    with pytest.raises(ValueError, match=r"only used with out_type='raw'"):
        VECA(arch=MINI, out_type='featmap', out_proj_dims=128)
    assert VECA(arch=MINI, out_type='global', out_proj_dims=64).output_proj is None  # == D
    with pytest.raises(ValueError, match=r"'pyramid' needs 1 or 4 out_indices"):
        VECA(arch=MINI, out_type='pyramid', out_indices=(1, 2))
    with pytest.raises(ValueError, match='pyramid_cfg'):
        VECA(arch=MINI, out_type='featmap', pyramid_cfg=dict(scales=(1, )))
    with pytest.raises(ValueError, match='frozen_stages'):
        VECA(arch=MINI, frozen_stages=4)
    with pytest.raises(ValueError, match='out_indices'):
        VECA(arch=MINI, out_type='featmap', out_indices=(3, ))
    with pytest.raises(ValueError, match=r'max_cores \(60\) must be a positive multiple'):
        VECA(arch=MINI, max_cores=60)
    with pytest.raises(ValueError, match='one non-negative weight per budget'):
        VECA(arch=MINI, budget_weights=(1, 2))
    with pytest.raises(ValueError, match='pass budget_weights'):
        VECA(arch=MINI, max_cores=72, num_cores=8)


@pytest.mark.parametrize('bad', [12, 0, 72, -8, True, '16', 16.0])
def test_invalid_num_cores(bad):
    with pytest.raises(ValueError, match=r'num_cores must be a multiple of 8 between 8 and the '
                                         r'bank size 64 \(one of \(8, 16, 24, 32, 40, 48, 56, '
                                         r'64\)\)'):
        VECA(arch=MINI, num_cores=bad)
    model = VECA(arch=MINI, num_cores=16)
    with pytest.raises(ValueError, match='num_cores must be'):
        model.num_cores = bad
    assert model.num_cores == 16  # unchanged by the failed assignment


def test_smaller_bank_caps_budgets_and_weights():
    model = VECA(arch=MINI, max_cores=32, num_cores=32)
    assert model.budgets == (8, 16, 24, 32) and model.budget_weights == (1, 1, 2, 2)
    assert len(model.core_tokens) == 4
    with pytest.raises(ValueError, match='bank size 32'):
        model.num_cores = 40


def test_drop_path_linear_rule():
    with torch.device('meta'):
        model = VECA(arch='small', drop_path_rate=0.2)
    assert isinstance(model.blocks[0].drop_path, nn.Identity)
    rates = [b.drop_path.drop_prob for b in model.blocks[1:]]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(0.2)


def test_default_out_indices():
    with torch.device('meta'):
        assert VECA(arch='small', out_type='pyramid').out_indices == (2, 5, 8, 11)
        assert VECA(arch='large', out_type='featmap').out_indices == (5, 11, 17, 23)
        assert VECA(arch='small', out_type='global').out_indices == (11, )
        assert VECA(arch='small').out_indices == (11, )
        assert VECA(arch='small', out_type='global', out_indices=(-1, 3, 3)).out_indices == \
            (3, 11)


# ------------------------------------------------------------------------------- forward
def expected_shapes(out_type: str, B: int, h: int, w: int):
    gh, gw = -(-h // 16), -(-w // 16)
    if out_type == 'raw':
        return [(B, 384), (B, gh * gw, 384)]
    if out_type == 'global':
        return [(B, 384)]
    if out_type == 'featmap':
        return [(B, 384, gh, gw)]
    return [(B, 384, 4 * gh, 4 * gw), (B, 384, 2 * gh, 2 * gw), (B, 384, gh, gw),
            (B, 384, -(-gh // 2), -(-gw // 2))]


@pytest.mark.parametrize('hw', [(64, 64), (81, 113), (16, 48), (200, 30)],
                         ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('out_type', OUT_TYPES)
def test_output_shapes(small_models, out_type, hw):
    model = small_models[out_type]
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *hw))
    assert isinstance(outs, tuple)
    shapes = expected_shapes(out_type, 2, *hw)
    if out_type == 'featmap':
        shapes = shapes * 4  # blocks 2, 5, 8, 11
    assert [tuple(o.shape) for o in outs] == shapes
    assert all(torch.isfinite(o).all() for o in outs)


def test_raw_global_featmap_agree(small_models):
    """global = core 0 and featmap = patch tokens of the same final-norm output as 'raw'."""
    x = torch.randn(1, 3, 48, 80)
    raw = small_models['raw']
    featmap = VECA(arch='small', out_type='featmap', out_indices=-1).eval()
    glob = VECA(arch='small', out_type='global').eval()
    featmap.load_state_dict(raw.state_dict())
    glob.load_state_dict(raw.state_dict())
    with torch.no_grad():
        g, p = raw(x)
        (m, ), (g2, ) = featmap(x), glob(x)
    torch.testing.assert_close(g2, g)
    torch.testing.assert_close(m.flatten(2).transpose(1, 2), p)


def test_padding_equals_explicit_zero_pad(small_models):
    model = small_models['raw']
    x = torch.randn(1, 3, 81, 113)
    with torch.no_grad():
        a = model(x)
        b = model(torch.nn.functional.pad(x, (0, 15, 0, 15)))  # to 96 x 128
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)


# ------------------------------------------------------------------------------- cores
def test_num_cores_changes_cost_not_shapes(op_calls):
    """Shapes stay, outputs change, and the op gets exactly C cores in front of N patches, so
    its cost 2NC + C^2 follows C (a dense ViT would pay N^2)."""
    torch.manual_seed(0)
    model = VECA(arch='small').eval()
    x = torch.randn(1, 3, 96, 128)  # 6 x 8 = 48 patches
    outs, cost = {}, {}
    for C in (8, 16, 64):
        model.num_cores = C
        op_calls.clear()
        with torch.no_grad():
            outs[C] = model(x)
        assert len(op_calls) == 12
        assert all(c == C and shape == (1, 6, C + 48, 64) for c, shape in op_calls)
        cost[C] = sum(2 * (s[2] - c) * c + c * c for c, s in op_calls)
    for C in (16, 64):
        assert [o.shape for o in outs[C]] == [o.shape for o in outs[8]]
        assert (outs[C][1] - outs[8][1]).abs().max() > 1e-3
    assert cost[8] < cost[16] < cost[64]
    assert cost[64] / cost[8] == pytest.approx((2 * 48 * 64 + 64 ** 2) / (2 * 48 * 8 + 64))


def test_forward_uses_only_active_cores():
    """A forward with C cores does not read the other cores at all: changing them leaves the
    output unchanged, and they get no gradient (not a zero one)."""
    torch.manual_seed(0)
    model = VECA(arch=MINI, num_cores=16, nested_dropout=False).train()
    model.rope.shift = model.rope.rescale = None  # deterministic training forward
    x = torch.randn(2, 3, 48, 32)
    g, p = model(x)
    (g.square().mean() + p.square().mean()).backward()
    for bank in (model.core_tokens, model.core_coords):
        assert all(bank[i].grad is not None and bank[i].grad.abs().sum() > 0 for i in (0, 1))
        assert all(bank[i].grad is None for i in range(2, 8))
    with torch.no_grad():
        for i in range(2, 8):
            model.core_tokens[i].add_(1.)
            model.core_coords[i].add_(1.)
        g2, p2 = model(x)
    torch.testing.assert_close(g2, g)
    torch.testing.assert_close(p2, p)


def test_nested_dropout_distribution():
    model = VECA(arch=MINI)
    torch.manual_seed(0)
    n = 4000
    counts = Counter(model.sample_num_cores() for _ in range(n))
    assert set(counts) == set(model.budgets)
    for budget, w in zip(model.budgets, model.budget_weights):
        p = w / 20
        assert abs(counts[budget] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (budget, counts)


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of test_nested_dropout_under_ddp (module level, so that spawn can pickle it)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(0)
        model = VECA(arch=MINI)  # the same weights on both ranks
        torch.manual_seed(100 + rank)  # ranks would draw different budgets if left alone
        used = []
        draw = model.sample_num_cores
        model.sample_num_cores = lambda: used.append(draw()) or used[-1]
        ddp = DistributedDataParallel(model, find_unused_parameters=True)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        for _ in range(6):
            opt.zero_grad()
            g, p = ddp(torch.randn(2, 3, 32, 32))
            (g.square().mean() + p.square().mean()).backward()
            opt.step()
        torch.save({'used': used, 'state': model.state_dict()}, osp.join(out_dir, f'{rank}.pt'))
    finally:
        dist.destroy_process_group()


def test_nested_dropout_under_ddp(tmp_path):
    """Two gloo ranks seeded differently draw the same budget at every step (rank 0's, as the
    official training), and DDP with find_unused_parameters=True keeps the replicas equal while
    the unused bank chunks get no gradient."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / 'init'), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f'{r}.pt') for r in (0, 1))
    assert r0['used'] == r1['used'] and len(r0['used']) == 6
    assert len(set(r0['used'])) > 1
    for k, v in r0['state'].items():
        torch.testing.assert_close(r1['state'][k], v, rtol=0, atol=0, msg=k)
    torch.manual_seed(0)
    fresh = VECA(arch=MINI).state_dict()
    for c in range(8):  # chunks beyond every drawn budget never moved; the first one did
        for bank in ('core_tokens', 'core_coords'):
            key = f'{bank}.{c}'
            assert torch.equal(r0['state'][key], fresh[key]) == (c >= max(r0['used']) // 8), key


def test_train_samples_cores_eval_uses_num_cores(op_calls):
    torch.manual_seed(0)
    model = VECA(arch=MINI, num_cores=24)
    x = torch.randn(1, 3, 32, 32)
    model.train()
    used = []
    for _ in range(25):
        op_calls.clear()
        model(x)
        assert len({c for c, _ in op_calls}) == 1  # one budget for all blocks of a forward
        used.append(op_calls[0][0])
    assert set(used) <= set(model.budgets) and len(set(used)) >= 4
    model.eval()
    op_calls.clear()
    with torch.no_grad():
        model(x)
    assert {c for c, _ in op_calls} == {24}
    model.train()
    model.nested_dropout = False
    op_calls.clear()
    model(x)
    assert {c for c, _ in op_calls} == {24}


def test_core_coordinates_move_and_reach_rope(monkeypatch):
    """Block l > 0 moves the cores by alpha_l * Linear(cores) before its RoPE tables; patch
    positions are the pixel centres in [-1, 1] and are augmented only in training."""
    torch.manual_seed(0)
    model = VECA(arch=MINI, num_cores=8).eval()
    seen = []
    real = RoPE2D.forward
    monkeypatch.setattr(RoPE2D, 'forward',
                        lambda self, c: seen.append(c.clone()) or real(self, c))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 48))
    assert len(seen) == 3
    raw0 = torch.cat(list(model.core_coords[:1]), 1)
    torch.testing.assert_close(seen[0][:, :8], torch.tanh(raw0))
    assert (seen[1][:, :8] - seen[0][:, :8]).abs().max() > 0  # moved by block 1's update
    torch.testing.assert_close(seen[0][0, 8:], patch_centres((2, 3), torch.device('cpu')))
    torch.testing.assert_close(seen[2][:, 8:], seen[0][:, 8:])
    torch.testing.assert_close(seen[0][0, 8:11], torch.tensor([[-2 / 3, -.5], [0, -.5],
                                                               [2 / 3, -.5]]))
    seen.clear()
    model.nested_dropout = False  # keep 8 cores, so seen[0][0, 8:] are the patches
    model.train()
    model(torch.randn(1, 3, 32, 48))
    assert not torch.allclose(seen[0][0, 8:], patch_centres((2, 3), torch.device('cpu')))


def test_rope_tables():
    rope = RoPE2D(32)
    coords = torch.tensor([[[0.5, -0.25], [0., 0.]]])
    cos, sin = rope(coords)
    assert cos.shape == sin.shape == (1, 2, 32) and cos.dtype == torch.float32
    # channels 0..15 rotate with x, 16..31 with y, pairs share a frequency; the last pair of
    # each half (the longest period) is switched off
    ang = torch.atan2(sin, cos)
    torch.testing.assert_close(ang[0, 0, 0], torch.tensor(2 * math.pi * .5 - 2 * math.pi))
    torch.testing.assert_close(ang[0, 0, 16], torch.tensor(2 * math.pi * -.25))
    torch.testing.assert_close(ang[0, 0, 0::2], ang[0, 0, 1::2])
    assert torch.all(cos[0, :, [14, 15, 30, 31]] == 1) and torch.all(sin[0, :, [14, 15]] == 0)
    assert torch.all(cos[0, 1] == 1)  # the origin: no rotation
    with pytest.raises(ValueError, match='zero_from'):
        RoPE2D(32, zero_from='mid')


# ------------------------------------------------------------------------------- training modes


def test_triton_backend_matches_reference(monkeypatch):
    """The model through the op's Triton kernels (compiled on GPU, interpreted on CPU), forward
    and backward (core coordinates included), against the reference on the same weights."""
    from mmeffattn.ops.core_periphery import op as cp_op

    probe = torch.zeros(1, 1, 16, 32)
    reasons = cp_op.core_periphery_triton_reasons(probe, probe, probe)
    if reasons:
        pytest.skip('Triton backend unavailable: ' + '; '.join(reasons))
    monkeypatch.delenv('MMEFFATTN_OPS_BACKEND')
    launched = []
    real = cp_op.core_periphery_attention_triton
    monkeypatch.setattr(cp_op, 'core_periphery_attention_triton',
                        lambda *a, **k: launched.append(1) or real(*a, **k))
    torch.manual_seed(0)
    kw = dict(arch=dict(embed_dims=64, depth=2, num_heads=2), num_cores=8, nested_dropout=False,
              rope_shift=None, rope_rescale=None)
    ref = VECA(**kw, attn_backend='reference').train()
    tri = VECA(**kw, attn_backend='triton').train()
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 80, 48)  # 5 x 3 patches
    outs_ref, outs_tri = ref(x), tri(x)
    assert len(launched) == 2  # the Triton path ran (one call per block)
    for a, b in zip(outs_ref, outs_tri):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    sum(o.square().mean() for o in outs_ref).backward()
    sum(o.square().mean() for o in outs_tri).backward()
    grads_tri = dict(tri.named_parameters())
    for name, p in ref.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads_tri[name].grad, p.grad, rtol=1e-4, atol=1e-6,
                                       msg=name)


# ------------------------------------------------------------------------------- weights


def test_pretrained_mismatch_names_keys(tmp_path):
    src = VECA(arch=MINI).state_dict()
    path = tmp_path / 'ckpt.pth'
    torch.save({k: v for k, v in src.items() if k != 'blocks.1.coord_head.alpha'}, path)
    model = VECA(arch=MINI, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r"missing keys \['blocks\.1\.coord_head\.alpha'\]"):
        model.init_weights()
    torch.save(src, path)
    model = VECA(arch=dict(MINI, embed_dims=96), init_cfg=dict(type='Pretrained',
                                                              checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r'patch_embed\.proj\.weight: checkpoint '
                                           r'\(64, 3, 16, 16\) vs model \(96, 3, 16, 16\)'):
        model.init_weights()
    model = VECA(arch=MINI, max_cores=32, num_cores=32,
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()  # a smaller bank takes the first chunks (extra ones: a warning)
    torch.save({'state_dict': {'backbone.' + k: v for k, v in src.items()}}, path)
    model = VECA(arch=MINI, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match=r"lie under 'backbone\.'.*prefix='backbone\.'"):
        model.init_weights()


# ------------------------------------------------------------------------------- registries
def test_build_from_registries():
    from mmdet.registry import MODELS as DET_MODELS
    from mmpretrain.registry import MODELS as CLS_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    with torch.device('meta'):
        model = MODELS.build(dict(type='mmeffattn.VECA', arch='small'))
        det = DET_MODELS.build(dict(type='mmeffattn.VECA', arch='base', out_type='pyramid'))
        seg = SEG_MODELS.build(dict(type='mmeffattn.VECA', arch='small', out_type='pyramid',
                                    num_cores=16))
    assert isinstance(model, VECA) and model.out_type == 'raw'
    assert det.embed_dims == 768 and seg.num_cores == 16
    clf = CLS_MODELS.build(dict(
        type='ImageClassifier', _scope_='mmpretrain',  # whatever scope an earlier test left
        backbone=dict(type='mmeffattn.VECA', arch=MINI, out_type='global', num_cores=16),
        neck=None, head=dict(type='LinearClsHead', num_classes=10, in_channels=64)))
    clf.eval()
    with torch.no_grad():
        assert clf(torch.randn(1, 3, 32, 32), mode='tensor').shape == (1, 10)


@pytest.mark.e2e
def test_tools_test_num_cores_override(tmp_path, shared_data):
    """tools/test.py CONFIG CKPT --cfg-options model.backbone.num_cores=16 evaluates the
    ImageNet config at 16 cores; an invalid budget stops with the backbone's error."""
    from e2e_helpers import run_tool, write_config
    from mmengine.config import Config
    from mmpretrain.registry import MODELS as CLS_MODELS

    root = shared_data('imagenet_sample') + '/'
    cfg_path = write_config(tmp_path / 'cfg.py', 'configs/veca/veca-s_8xb128_in1k.py', f'''
data_root = {root!r}
val_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=8))
test_dataloader = val_dataloader
''')
    torch.manual_seed(0)
    clf = CLS_MODELS.build(Config.fromfile(cfg_path).model)
    ckpt = tmp_path / 'random.pth'
    torch.save({'state_dict': clf.state_dict(), 'meta': {}}, ckpt)
    work, out_json = str(tmp_path / 'work'), str(tmp_path / 'metrics.json')
    proc = run_tool(['tools/test.py', cfg_path, str(ckpt), '--work-dir', work, '--out-json',
                     out_json, '--cfg-options', 'model.backbone.num_cores=16'])
    metrics = json.load(open(out_json))['metrics']
    assert 0.0 <= metrics['accuracy/top1'] <= 100.0
    assert 'num_cores=16' in proc.stdout + proc.stderr  # the model the log describes
    proc = run_tool(['tools/test.py', cfg_path, str(ckpt), '--work-dir', work, '--cfg-options',
                     'model.backbone.num_cores=12'], expect_ok=False)
    assert proc.returncode != 0
    assert 'num_cores must be a multiple of 8' in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------- configs
def _classifier_from_config(path: str):
    from mmengine.config import Config
    from mmpretrain.registry import MODELS as CLS_MODELS

    cfg = Config.fromfile(osp.join(ROOT, path))
    cfg.model.backbone.arch = MINI  # the recipe's mechanics on a small trunk
    cfg.model.head.in_channels = 64
    if cfg.model.get('neck'):
        cfg.model.neck.input_features = 64
    if cfg.model.backbone.get('frozen_stages', -1) > 0:
        cfg.model.backbone.frozen_stages = MINI['depth']
    return cfg, CLS_MODELS.build(cfg.model)


def test_finetune_config_layer_decay():
    """The fine-tuning recipe's layer-wise lr decay sees the trunk's depth (get_layer_depth):
    stem and core bank lowest, block i one step above block i - 1, the head at the full lr;
    no weight decay on norms, biases, the core bank and the coordinate step sizes."""
    from mmpretrain.engine.optimizers import LearningRateDecayOptimWrapperConstructor

    cfg, model = _classifier_from_config('configs/veca/veca-s_8xb128_in1k.py')
    assert cfg.optim_wrapper.constructor == 'LearningRateDecayOptimWrapperConstructor'
    assert cfg.find_unused_parameters and cfg.model.backbone.nested_dropout
    ow_cfg = cfg.optim_wrapper.to_dict()
    ow_cfg.pop('constructor')
    paramwise = ow_cfg.pop('paramwise_cfg')
    wrapper = LearningRateDecayOptimWrapperConstructor(ow_cfg, paramwise)(model)
    groups = {g['param_name']: g for g in wrapper.optimizer.param_groups}
    decay, base_lr = paramwise['layer_decay_rate'], cfg.optim_wrapper.optimizer.lr
    depth = MINI['depth']

    def lr(name):
        return groups[name]['lr'] / base_lr

    assert lr('backbone.core_tokens.0') == pytest.approx(decay ** (depth + 1))
    assert lr('backbone.patch_embed.proj.weight') == pytest.approx(decay ** (depth + 1))
    for i in range(depth):
        assert lr(f'backbone.blocks.{i}.attn.q.weight') == pytest.approx(decay ** (depth - i))
    assert lr('backbone.blocks.2.coord_head.alpha') == lr('backbone.blocks.2.ffn.fc1.weight')
    assert lr('head.fc.weight') == pytest.approx(1.0)
    assert lr(f'backbone.norm{depth - 1}.weight') == pytest.approx(1.0)
    for name in ('backbone.core_tokens.3', 'backbone.core_coords.0',
                 'backbone.blocks.1.norm1.weight', 'backbone.blocks.1.coord_head.alpha',
                 'backbone.blocks.0.attn.q.bias'):
        assert groups[name]['weight_decay'] == 0, name
    assert groups['backbone.blocks.0.attn.q.weight']['weight_decay'] == 0.05


def test_linear_probe_config_trains_only_the_head():
    _, model = _classifier_from_config('configs/veca/veca-s_8xb2048-linear-coslr-90e_in1k.py')
    model.train()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == ['head.fc.bias', 'head.fc.weight']
    bb = model.backbone
    assert not bb.nested_dropout and not bb.rope.training  # no coordinate augmentation
    assert not any(m.training for b in bb.blocks for m in b.modules())
    feats = model.extract_feat(torch.randn(2, 3, 32, 32))
    assert feats[0].shape == (2, 64)
