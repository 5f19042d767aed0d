"""Tests of the SEMA / MILA backbone (mmeffattn/models/backbones/sema.py)."""

import pytest
import torch
import torch.nn as nn

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.backbones import sema as sema_mod
from mmeffattn.models.backbones.sema import MILA, SEMA, checkpoint_filter_mlla
from mmeffattn.models.layers import rope as rope_mod
from mmeffattn.models.layers.rope import apply_rope_2d
from mmeffattn.models.layers.tokens import map_to_tokens, tokens_to_map
from mmeffattn.registry import MODELS

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

ATTN_TYPES = ['sema', 'linear']
TINY_CHANNELS = [64, 128, 256, 512]
# Parameter counts of the official MLLA classifiers (models/mlla.py of LeapLabTHU/MLLA, with
# the 1000-way head and the final LayerNorm), counted from the official code.
OFFICIAL_MLLA_PARAMS = {'tiny': 24_392_200, 'small': 43_015_048, 'base': 95_983_960}
# A reduced arch for the mechanism tests (checkpoint loading, with_cp, norm_eval): the same code
# paths as 'tiny' with head dim 32, at a fraction of the build and run time.
MINI = dict(embed_dims=32, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8])


@pytest.fixture(scope='module', params=ATTN_TYPES)
def tiny_eval(request):
    """One tiny model per attn_type in eval mode, shared by the tests that do not modify it."""
    return SEMA(arch='tiny', attn_type=request.param).eval()


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def expected_hw(h: int, w: int, i: int):
    """Output grid of stage i: ceil to a multiple of 4 in the stem, then ceil-halving."""
    h, w = -(-h // 4), -(-w // 4)
    for _ in range(i):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


def official_rope_oracle(x: torch.Tensor, h: int, w: int, base: int = 10000) -> torch.Tensor:
    """The official MLLA ``RoPE`` module (models/mlla.py), rewritten as a test oracle.

    x: ``[B, h, w, C]``.
    """
    c = x.shape[-1]
    k_max = c // (2 * 2)
    theta_ks = 1 / (base**(torch.arange(k_max) / k_max))
    grids = torch.meshgrid([torch.arange(h), torch.arange(w)], indexing='ij')
    angles = torch.cat([t.unsqueeze(-1) * theta_ks for t in grids], dim=-1)  # [h, w, c/2]
    rot = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)  # [h, w, c/2, 2]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(torch.view_as_complex(rot) * xc).flatten(-2)


# ------------------------------------------------------------------------------- construction
@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_arch_param_counts(arch):
    with torch.device('meta'):  # counting only: skip the init work
        mila, sema = MILA(arch=arch), SEMA(arch=arch)
    c = mila.num_features
    # Our backbone has an output norm per stage and no classifier: swap those for the official
    # classification norm + 1000-way head, and we must hit the official count exactly.
    as_classifier = n_params(mila) - sum(2 * ch for ch in c) + 2 * c[-1] + c[-1] * 1000 + 1000
    assert as_classifier == OFFICIAL_MLLA_PARAMS[arch]
    # SEMA adds one value projection Linear(dim, dim) per block.
    extra = sum(d * (ch * ch + ch) for d, ch in zip(mila.arch_settings['depths'], c))
    assert n_params(sema) == n_params(mila) + extra
    assert sema.attn_type == 'sema' and mila.attn_type == 'linear'


def test_tiny_param_count_with_head():
    model = SEMA(arch='tiny')
    total = n_params(model) + n_params(nn.Linear(512, 1000))
    assert 25.5e6 < total < 26.5e6  # SEMA-T ~26M with a 1000-class head
    mila_total = n_params(MILA(arch='t')) + n_params(nn.Linear(512, 1000))
    assert 24e6 < mila_total < 25e6  # MILA-T (README rounds to 25M)


def test_arch_aliases_and_custom_dict():
    assert SEMA._parse_arch('t') == SEMA._parse_arch('tiny')
    assert SEMA._parse_arch('B')['embed_dims'] == 96
    custom = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
    model = SEMA(arch=custom)
    assert model.num_features == [32, 64, 128, 256]
    assert len(model.layers[2].blocks) == 1
    with pytest.raises(ValueError, match=r"arch 'embed_dims' is the first stage's width, an int"):
        SEMA(arch=dict(custom, embed_dims=[32, 64, 128, 256]))


def test_invalid_arch_lists_valid_names():
    with pytest.raises(KeyError, match=r"Unknown arch 'huge'.*'base'.*'small'.*'tiny'"):
        SEMA(arch='huge')
    with pytest.raises(ValueError, match='embed_dims'):
        SEMA(arch=dict(embed_dims=64, depths=[2, 2, 2, 2]))


@pytest.mark.parametrize('window_size', [0, -3, 2.5, True])
def test_invalid_window_size(window_size):
    with pytest.raises(ValueError, match='window_size'):
        SEMA(arch='tiny', window_size=window_size)


def test_invalid_options():
    with pytest.raises(ValueError, match='attn_type'):
        SEMA(arch='tiny', attn_type='flash')
    with pytest.raises(ValueError, match='out_indices'):
        SEMA(arch='tiny', out_indices=(0, 4))
    with pytest.raises(ValueError, match='frozen_stages'):
        SEMA(arch='tiny', frozen_stages=5)


def test_drop_path_linear_rule():
    with torch.device('meta'):
        model = SEMA(arch='tiny', drop_path_rate=0.3)
    blocks = [b for layer in model.layers for b in layer.blocks]
    assert isinstance(blocks[0].drop_path, nn.Identity)  # rate 0 for the first block
    rates = [b.drop_path.drop_prob for b in blocks[1:]]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(0.3)
    assert rates[0] == pytest.approx(0.3 / (len(blocks) - 1))


# ------------------------------------------------------------------------------- forward
@pytest.mark.parametrize('hw', [(224, 224), (33, 47)],
                         ids=lambda s: f'{s[0]}x{s[1]}')
def test_output_shapes(tiny_eval, hw):
    model = tiny_eval
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    assert isinstance(outs, tuple) and len(outs) == 4
    for i, out in enumerate(outs):
        assert out.shape == (1, TINY_CHANNELS[i], *expected_hw(*hw, i))
        assert torch.isfinite(out).all()


@pytest.mark.parametrize('out_indices,expect', [((1, 3), (1, 3)), ((-1, ), (3, )), (2, (2, )),
                                                ((0, ), (0, ))])
def test_out_indices(out_indices, expect):
    model = SEMA(arch=MINI, out_indices=out_indices).eval()
    assert model.out_indices == expect
    for i in range(4):
        assert hasattr(model, f'norm{i}') == (i in expect)
    with torch.no_grad():
        outs = model(torch.randn(2, 3, 64, 64))
    assert [o.shape for o in outs] == [(2, 32 * 2**i, *expected_hw(64, 64, i)) for i in expect]


def test_sema_op_receives_window_and_grid(monkeypatch):
    calls = []
    real = sema_mod.sema_attention_qk

    def spy(qk, v, hw, window_size, **kw):
        calls.append((tuple(v.shape), tuple(hw), window_size))
        assert qk.shape == (v.shape[0], v.shape[2], 2, v.shape[1], v.shape[3])
        return real(qk, v, hw, window_size, **kw)

    monkeypatch.setattr(sema_mod, 'sema_attention_qk', spy)
    model = SEMA(arch=MINI, window_size=5).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 60, 44))
    assert len(calls) == sum(MINI['depths'])
    assert calls[0] == ((1, 1, 15 * 11, 32), (15, 11), 5)  # [B, heads, N, head_dim]
    assert calls[-1] == ((1, 8, 2 * 2, 32), (2, 2), 5)


def test_triton_backend_matches_reference(monkeypatch):
    """The model's q/k/v views through the Triton kernels (compiled on GPU, interpreted on CPU)."""
    from mmeffattn.ops.sema.op import sema_triton_reasons

    x = torch.randn(1, 3, 36, 28)
    probe = torch.zeros(1, 1, 1, 32, device=x.device)
    reasons = sema_triton_reasons(probe, probe, probe)
    if reasons:
        pytest.skip('Triton backend unavailable: ' + '; '.join(reasons))
    torch.manual_seed(0)
    ref = SEMA(arch=MINI, attn_backend='reference', window_size=3).eval()
    tri = SEMA(arch=MINI, attn_backend='triton', window_size=3).eval()
    tri.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for a, b in zip(ref(x), tri(x)):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------- RoPE
@pytest.mark.parametrize('h,w,c', [(14, 14, 64), (5, 9, 128), (1, 7, 32)])
def test_rope_matches_official(h, w, c):
    x = torch.randn(2, h, w, c)
    ours = apply_rope_2d(x.reshape(2, h * w, c), (h, w)).reshape(2, h, w, c)
    torch.testing.assert_close(ours, official_rope_oracle(x, h, w), rtol=1e-5, atol=1e-5)


def test_rope_table_made_in_inference_mode_serves_training():
    x = torch.randn(1, 13 * 11, 64)
    with torch.inference_mode():
        apply_rope_2d(x, (13, 11))  # fills the cache inside inference mode
    y = x.clone().requires_grad_()
    apply_rope_2d(y, (13, 11)).sum().backward()
    assert y.grad is not None and torch.isfinite(y.grad).all()


def test_compiled_graph_takes_the_rope_table_and_computes_no_trigonometry():
    """Under torch.compile the table comes from the ``mmeffattn::rope_table_2d`` operator (once
    per block), not from ``cos``/``sin`` recomputed inside the graph, for static and symbolic
    sizes."""
    attn = sema_mod.LinearAttention(32, 2).eval()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(attn, backend=backend, dynamic=dynamic, fullgraph=True)
        x = torch.randn(1, 6 * 4, 32)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, (6, 4)), attn(x, (6, 4)), rtol=1e-5, atol=1e-5)
        targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == 'call_function']
        assert sum('rope_table_2d' in t for t in targets) == 1, targets
        assert not any(t.split('.')[-1] in ('cos', 'sin', 'polar') for t in targets), targets
    torch._dynamo.reset()


def test_rope_table_operator_passes_opcheck_and_returns_a_copy():
    """``mmeffattn::rope_table_2d`` (the table under torch.compile): schema, fake tensor and
    dispatch checks; the cached table, as a copy the compiled code may overwrite."""
    args = (5, 7, 16, 10000.0, torch.device('cpu'))
    torch.library.opcheck(torch.ops.mmeffattn.rope_table_2d.default, args)
    table = torch.ops.mmeffattn.rope_table_2d(*args)
    cached = rope_mod.rope_rotation(5, 7, 16, 10000.0, torch.device('cpu'))
    torch.testing.assert_close(table, cached, rtol=0, atol=0)
    table.zero_()
    assert cached.abs().sum() > 0


def test_compiled_odd_head_dim_equals_eager():
    """With an odd head dim the RoPE pairs straddle two heads; compiled still equals eager."""
    torch.manual_seed(0)
    attn = sema_mod.LinearAttention(12, 4).eval()  # head dim 3
    x = torch.randn(2, 3 * 5, 12)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(attn, backend='aot_eager', fullgraph=True)(x, (3, 5))
        torch.testing.assert_close(got, attn(x, (3, 5)), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------- training modes


# ------------------------------------------------------------------------------- weights
def test_pretrained_official_classification_checkpoint(tmp_path):
    """An official-style ImageNet checkpoint: 'model' wrapper, head, final norm, RoPE buffers."""
    src = MILA(arch=MINI, out_indices=(3, ))
    state = {k: v for k, v in src.state_dict().items() if not k.startswith('norm3.')}
    state.update({'head.weight': torch.zeros(1000, 256), 'head.bias': torch.zeros(1000),
                  'norm.weight': torch.ones(256), 'norm.bias': torch.zeros(256),
                  'layers.0.blocks.0.attn.rope.rotations': torch.zeros(56, 56, 16, 2)})
    path = tmp_path / 'mlla_t.pth'
    torch.save({'model': state, 'epoch': 300}, path)

    filtered = checkpoint_filter_mlla(torch.load(path))
    assert not any(k.startswith(('head.', 'norm.')) or 'rope' in k for k in filtered)

    dst = MILA(arch=MINI, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    norm0_before = dst.norm0.weight.clone()
    dst.init_weights()
    for k, v in state.items():
        if k in dst.state_dict():
            assert torch.equal(v, dst.state_dict()[k]), k
    assert torch.equal(dst.norm0.weight, norm0_before)  # output norms keep their init


def test_checkpoint_filter_is_pure():
    sd = {'module.patch_embed.conv1.conv.weight': torch.zeros(1),
          'module.head.bias': torch.zeros(1)}
    orig = dict(sd)
    out = checkpoint_filter_mlla({'model': sd})
    assert out.keys() == {'patch_embed.conv1.conv.weight'}
    assert sd == orig
    sd = {'norm.weight': torch.ones(2), 'norm0.weight': torch.ones(2), 'head.weight': torch.ones(2),
          'layers.0.blocks.0.attn.rope.rotations': torch.ones(1)}
    assert checkpoint_filter_mlla(sd).keys() == {'norm0.weight'}
    assert checkpoint_filter_mlla(sd, final_norm='norm3').keys() == {'norm0.weight',
                                                                     'norm3.weight'}


def test_default_init():
    model = SEMA(arch=MINI)
    model.init_weights()
    lin = model.layers[0].blocks[0].in_proj
    assert lin.bias.abs().max() == 0 and 0.01 < lin.weight.std() < 0.03
    ln = model.layers[0].blocks[0].norm1
    assert torch.all(ln.weight == 1) and torch.all(ln.bias == 0)


# ------------------------------------------------------------------------------- registries
def test_build_from_registries():
    from mmdet.registry import MODELS as DET_MODELS

    with torch.device('meta'):  # resolution and construction only
        sema = MODELS.build(dict(type='mmeffattn.SEMA', arch='tiny'))
        mila = MODELS.build(dict(type='mmeffattn.MILA', arch='tiny'))
    assert isinstance(sema, SEMA) and sema.attn_type == 'sema'
    assert isinstance(mila, MILA) and mila.attn_type == 'linear'
    det = DET_MODELS.build(dict(type='mmeffattn.SEMA', arch='tiny', out_indices=(1, 2, 3)))
    assert isinstance(det, SEMA) and det.out_indices == (1, 2, 3)


# ------------------------------------------------------------------------------- SEMA switches
def _attn_input(dim=64, heads=2, hw=(9, 11), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, hw[0] * hw[1], dim, generator=g), hw


def test_with_mean_switch_adds_exactly_the_value_mean():
    torch.manual_seed(0)
    on = sema_mod.SEMAttention(64, 2, window_size=4)
    off = sema_mod.SEMAttention(64, 2, window_size=4, with_mean=False)
    off.load_state_dict(on.state_dict())
    x, hw = _attn_input()
    with torch.no_grad():
        diff = on(x, hw) - off(x, hw)  # [B, N, C]
        v_mean = on.v(x).mean(dim=1, keepdim=True)  # the averaging term, per channel
    torch.testing.assert_close(diff, v_mean.expand_as(diff), rtol=1e-5, atol=1e-5)
    assert v_mean.abs().max() > 1e-3  # the switch changed the computation


def _paper_sema_forward(attn: 'sema_mod.SEMAttention', x: torch.Tensor, hw) -> torch.Tensor:
    """SEMA's mixer as the paper writes it: window softmax ``A_Phi V`` (the op without its
    mean), plus ``mean_j v_j``, plus the LePE of v."""
    B, N, C = x.shape
    nh, hd = attn.num_heads, C // attn.num_heads
    qk = attn.qk(x).reshape(B, N, 2, nh, hd)
    v = attn.v(x)
    out = sema_mod.sema_attention_qk(qk, v.reshape(B, N, nh, hd).transpose(1, 2), hw,
                                     attn.window_size, with_mean=False, out_layout='bnhd',
                                     backend=attn.backend)
    return (out.reshape(B, N, C) + v.mean(dim=1, keepdim=True)
            + map_to_tokens(attn.lepe(tokens_to_map(v, hw))))


def _triton_unavailable() -> str:
    from mmeffattn.ops.sema.op import sema_triton_reasons
    probe = torch.zeros(1, 1, 1, 32)
    return '; '.join(sema_triton_reasons(probe, probe, probe))


@pytest.mark.parametrize('backend', ['reference', 'triton'])
def test_sema_attention_is_window_softmax_plus_the_value_mean(backend):
    """The module (the mean returned by the op and added at the call site) equals the paper's
    formula, forward and the gradients of the input and of every parameter."""
    if backend == 'triton' and _triton_unavailable():
        pytest.skip('Triton backend unavailable: ' + _triton_unavailable())
    torch.manual_seed(0)
    attn = sema_mod.SEMAttention(64, 2, window_size=4, backend=backend)
    with torch.no_grad():  # a visible bias, and q, k large enough for non-uniform windows
        attn.lepe.bias.normal_()
        attn.qk.weight.normal_(std=0.3)
    x, hw = _attn_input()
    x = x.clone().requires_grad_()
    params = [p for _, p in attn.named_parameters()]
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    new = attn(x, hw)
    new_grads = torch.autograd.grad(new, (x, *params), dy)
    old = _paper_sema_forward(attn, x, hw)
    old_grads = torch.autograd.grad(old, (x, *params), dy)
    peak = float(old.detach().abs().max())
    torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6 * peak)
    names = ['x'] + [n for n, _ in attn.named_parameters()]
    for name, a, b in zip(names, new_grads, old_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()),
                                   msg=lambda m: f'd{name}: {m}')
    assert v_mean_is_visible(attn, x)


def v_mean_is_visible(attn, x) -> bool:
    """The inputs' value mean is far from zero (the mean term is tested, not a no-op)."""
    with torch.no_grad():
        return bool(attn.v(x).mean(dim=1).abs().max() > 1e-2)


def test_value_proj_switch_uses_the_input_and_drops_parameters():
    torch.manual_seed(0)
    with_v = sema_mod.SEMAttention(64, 2, window_size=4)
    no_v = sema_mod.SEMAttention(64, 2, window_size=4, value_proj=False)
    assert no_v.v is None and not any(k.startswith('v.') for k in no_v.state_dict())
    assert n_params(with_v) - n_params(no_v) == 64 * 65
    no_v.load_state_dict({k: v for k, v in with_v.state_dict().items()
                          if not k.startswith('v.')})
    x, hw = _attn_input()
    with torch.no_grad():
        assert not torch.allclose(with_v(x, hw), no_v(x, hw), atol=1e-4)
        with_v.v.weight.copy_(torch.eye(64))  # an identity projection is v = x
        with_v.v.bias.zero_()
        torch.testing.assert_close(with_v(x, hw), no_v(x, hw), rtol=1e-5, atol=1e-5)
    # the backbone: one Linear(dim, dim) less per block
    full, lean = SEMA(arch=MINI), SEMA(arch=MINI, value_proj=False)
    dims = [32 * 2**i for i, d in enumerate(MINI['depths']) for _ in range(d)]
    assert n_params(full) - n_params(lean) == sum(c * (c + 1) for c in dims)


def test_local_attn_linear_calls_window_linear_attention(monkeypatch):
    from mmeffattn.models.layers.window_linear import window_linear_attention
    calls = []

    def spy(q, k, v, hw, window_size, **kw):
        calls.append((tuple(hw), window_size, kw.get('with_mean')))
        return window_linear_attention(q, k, v, hw, window_size, **kw)

    monkeypatch.setattr(sema_mod, 'window_linear_attention', spy)
    torch.manual_seed(0)
    soft = sema_mod.SEMAttention(64, 2, window_size=4)
    lin = sema_mod.SEMAttention(64, 2, window_size=4, local_attn='linear')
    lin.load_state_dict(soft.state_dict())
    x, hw = _attn_input()
    with torch.no_grad():
        out = lin(x, hw)
        assert not torch.allclose(out, soft(x, hw), atol=1e-4)
        # the oracle: the reference function on the module's own q, k, v, plus the LePE
        B, N, C = x.shape
        q, k = lin.qk(x).reshape(B, N, 2, 2, 32).permute(2, 0, 3, 1, 4)
        v = lin.v(x)
        ref = window_linear_attention(q, k, v.reshape(B, N, 2, 32).transpose(1, 2), hw, 4)
        ref = ref.transpose(1, 2).reshape(B, N, C) + \
            lin.lepe(v.transpose(1, 2).reshape(B, C, *hw)).flatten(2).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert calls[0] == (hw, 4, True)


@pytest.mark.parametrize('switches', [
    dict(with_mean=False), dict(value_proj=False), dict(local_attn='linear'),
    dict(with_mean=False, value_proj=False, local_attn='linear')],
    ids=['no-mean', 'no-vproj', 'linear-local', 'all-three'])
def test_switches_in_the_backbone(switches):
    """Each switch changes the backbone's output (same shared weights), odd sizes keep their
    shapes, and the gradients are finite."""
    torch.manual_seed(0)
    ref = SEMA(arch=MINI, window_size=3)
    with torch.no_grad():  # at init (std .02) the attention branch is ~1e-6 of the output
        for name, p in ref.named_parameters():  # and q, k ~ 0 make every window uniform
            if name.endswith(('in_proj.weight', 'attn.qk.weight', 'out_proj.weight')):
                p.normal_(std=0.3)
    model = SEMA(arch=MINI, window_size=3, **switches)
    model.load_state_dict(ref.state_dict(), strict=False)  # value_proj=False: fewer keys
    x = torch.randn(2, 3, 29, 43)
    ref.eval(), model.eval()
    with torch.no_grad():
        outs, ref_outs = model(x), ref(x)
    assert [o.shape for o in outs] == [(2, 32 * 2**i, *expected_hw(29, 43, i)) for i in range(4)]
    assert (outs[0] - ref_outs[0]).abs().max() > 1e-3
    model.train()
    xg = x[:, :, :21, :19].clone().requires_grad_()
    sum(o.pow(2).mean() for o in model(xg)).backward()
    assert torch.isfinite(xg.grad).all() and xg.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_mila_switches():
    torch.manual_seed(0)
    mila = MILA(arch=MINI).eval()
    assert not any('.attn.v.' in k for k in mila.state_dict())
    meaned = MILA(arch=MINI, with_mean=True).eval()
    meaned.load_state_dict(mila.state_dict())
    projected = MILA(arch=MINI, value_proj=True)
    assert any('.attn.v.' in k for k in projected.state_dict())
    x = torch.randn(1, 3, 27, 35)
    with torch.no_grad():
        assert (meaned(x)[0] - mila(x)[0]).abs().max() > 1e-5
    with pytest.raises(ValueError, match='local_attn'):  # not an option of MILA's attention
        MILA(arch=MINI, local_attn='linear')


def test_switch_errors():
    with pytest.raises(ValueError, match='local_attn'):
        SEMA(arch=MINI, local_attn='relu')
    with pytest.raises(ValueError, match='with_mean'):
        SEMA(arch=MINI, with_mean='yes')
    with pytest.raises(ValueError, match="'softmax' does not take"):
        SEMA(arch=MINI, attn_type='softmax', value_proj=False)
    msg = SEMA(arch=MINI, value_proj=False).mismatch_cause(
        [], ['layers.0.blocks.0.attn.v.weight'], [])
    assert 'value_proj=True' in msg


@pytest.mark.parametrize('groups,bias,affine', [(1, False, True), (4, True, True),
                                                (1, True, False)],
                         ids=['dense', 'depthwise-bias', 'no-affine'])
def test_conv_norm_act_folds_eval_bn(groups, bias, affine):
    """In eval mode the BatchNorm is folded into the convolution (one conv call, no BN call):
    the same output and parameter gradients (norm_eval training) as conv -> BN -> act, and the
    in-place ReLU leaves the input alone."""
    from mmeffattn.models.layers import ConvNormAct
    torch.manual_seed(0)
    m = ConvNormAct(4, 8 if groups == 1 else 4, 3, padding=1, groups=groups, bias=bias,
                    norm_cfg=dict(type='BN', affine=affine))
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        m.norm.running_mean.uniform_(-1, 1)
        m.norm.running_var.uniform_(0.5, 2)
        if affine:
            m.norm.weight.uniform_(0.5, 1.5)
            m.norm.bias.uniform_(-1, 1)
    m.eval()
    x = torch.randn(2, 4, 9, 11)
    x0 = x.clone()
    calls = []
    m.norm.register_forward_hook(lambda *a: calls.append('norm'))
    out = m(x)
    assert not calls and torch.equal(x, x0)  # folded; the input untouched
    ref = torch.relu(m.norm(m.conv(x)))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), list(m.parameters()))
    ref_grads = torch.autograd.grad(ref.square().sum(), list(m.parameters()))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    m.train()  # training mode: batch statistics, the BN module itself
    m(x)
    assert calls == ['norm', 'norm']  # (the reference call above, then this one)


@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_linear_attention_heads_match_float64(dtype, tol):
    """MILA's attention takes per-head products (fp32) or block-diagonal full-width products
    (16-bit, where oneDNN copies strided heads); both equal the float64 per-head formula within
    the dtype's rounding, the mean term included."""
    from mmeffattn.models.backbones.sema import LinearAttention
    torch.manual_seed(0)
    attn = LinearAttention(64, 4, with_mean=True).eval()
    x = torch.randn(2, 7 * 9, 64)
    with torch.no_grad():
        ref = attn.double()(x.double(), (7, 9))
        out = attn.to(dtype)(x.to(dtype), (7, 9))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert out.dtype == dtype and err < tol, err


@pytest.mark.parametrize('norm', [None, 'BN'], ids=['conv-relu', 'conv-bn-relu'])
@pytest.mark.parametrize('bf16', [False, True], ids=['fp32', 'bf16-autocast'])
def test_conv_norm_act_fuses_relu_in_cpu_inference(norm, bf16):
    """Eager CPU inference runs the ReLU inside oneDNN's convolution: the result of the plain
    conv -> (folded BN) -> ReLU (with a gradient recorded), in fp32 and under bf16 autocast."""
    from mmeffattn.models.layers import ConvNormAct
    from mmeffattn.models.layers.conv_norm_act import CONV_POINTWISE
    if CONV_POINTWISE is None:
        pytest.skip('torch is built without oneDNN')
    torch.manual_seed(0)
    m = ConvNormAct(8, 16, 3, stride=2, padding=1, norm_cfg=norm and dict(type='BN')).eval()
    x = torch.randn(1, 8, 15, 17).contiguous(memory_format=torch.channels_last)
    with torch.autocast('cpu', torch.bfloat16, enabled=bf16):
        ref = m(x).detach()  # the plain path
        with torch.no_grad(), torch.profiler.profile() as prof:
            out = m(x)
    assert any('_convolution_pointwise' in e.key for e in prof.key_averages())
    assert not any(e.key in ('aten::relu_', 'aten::clamp_min_') for e in prof.key_averages())
    assert out.dtype == ref.dtype == (torch.bfloat16 if bf16 else torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # (bf16: bit-equal here)
