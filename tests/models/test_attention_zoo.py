"""Tests of the attention zoo (mmeffattn/models/backbones/attention_zoo.py): every token mixer in
the SEMA pyramid, built from the three downstream registries, forward and backward on odd
sizes, each through its public op."""
import sys

import pytest
import torch
import torch.nn as nn

import mmeffattn  # noqa: F401  (registers the models)
import mmeffattn.ops as ops
from mmeffattn.models.backbones import SEMA
from mmeffattn.models.backbones import attention_zoo as zoo

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

ZOO = ['sema', 'linear', 'window', 'softmax', 'laplacian', 'core_periphery', 'dynamic']
MINI = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
#: the public ops each mixer must run (the global softmax and MILA's linear attention are
#: plain PyTorch: SDPA and matmuls)
OPS = {'sema': ['sema_attention_qk'], 'window': ['sema_attention_qk'], 'linear': [],
       'softmax': [],
       'laplacian': ['laplacian_kernel', 'newton_schulz_pinv'],
       'core_periphery': ['core_periphery_attention'],
       'dynamic': ['dynamic_dwconv', 'dynamic_weight']}


def expected_hw(h: int, w: int, i: int):
    h, w = -(-h // 4), -(-w // 4)
    for _ in range(i):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


def spy_ops(monkeypatch, model: nn.Module, names) -> dict:
    """Count the calls of the public ops ``names`` in the modules that imported them (wherever
    the model's classes live), so the test does not depend on the ops' private layout."""
    calls = {n: 0 for n in names}
    for mod in {sys.modules[type(m).__module__] for m in model.modules()}:
        for name in names:
            real = getattr(mod, name, None)
            if real is getattr(ops, name):

                def counted(*args, _real=real, _name=name, **kwargs):
                    calls[_name] += 1
                    return _real(*args, **kwargs)

                monkeypatch.setattr(mod, name, counted)
    return calls


def test_registry_holds_every_kind():
    assert set(zoo.mixer_names()) == set(ZOO)


@pytest.mark.parametrize('attn_type', ZOO)
def test_zoo_variant_in_three_downstreams(attn_type, monkeypatch):
    """Build from mmdet, mmseg and mmpretrain; forward/backward on odd sizes through the ops."""
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS as CLS
    from mmseg.registry import MODELS as SEG
    cfg = dict(type='mmeffattn.SEMA', arch=MINI, attn_type=attn_type, window_size=3)
    torch.manual_seed(0)
    det = DET.build(cfg)
    seg = SEG.build(dict(cfg, out_indices=(1, 3)))
    cls = CLS.build(dict(cfg, out_indices=(3, )))
    for m in (det, seg, cls):
        assert isinstance(m, SEMA) and m.attn_type == attn_type
    calls = spy_ops(monkeypatch, det, OPS[attn_type])
    # train mode, batch 2 (LaplacianFormer's whitening needs >= 2 tokens in the 1x1 last stage)
    x = torch.randn(2, 3, 35, 27, requires_grad=True)
    outs = det(x)
    assert [o.shape for o in outs] == [(2, 32 * 2**i, *expected_hw(35, 27, i)) for i in range(4)]
    sum(o.pow(2).mean() for o in outs).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    attn = det.layers[0].blocks[0].attn
    grads = [p.grad for p in attn.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(n > 0 for n in calls.values()), calls
    seg.eval(), cls.eval()
    with torch.no_grad():
        seg_outs = seg(torch.randn(1, 3, 21, 30))
        cls_outs = cls(torch.randn(1, 3, 21, 30))
    assert [o.shape[1:] for o in seg_outs] == [(64, *expected_hw(21, 30, 1)),
                                              (256, *expected_hw(21, 30, 3))]
    assert cls_outs[0].shape == (1, 256, *expected_hw(21, 30, 3))


def test_window_is_sema_without_the_mean(monkeypatch):
    seen = []
    sema_mod = sys.modules[SEMA.__module__]
    real = sema_mod.sema_attention_qk

    def spy(*args, **kwargs):
        seen.append(kwargs.get('with_mean'))
        return real(*args, **kwargs)

    monkeypatch.setattr(sema_mod, 'sema_attention_qk', spy)
    torch.manual_seed(0)
    sema = SEMA(arch=MINI).eval()
    window = SEMA(arch=MINI, attn_type='window').eval()
    window.load_state_dict(sema.state_dict())  # the same parameters
    with torch.no_grad():
        window(torch.randn(1, 3, 32, 32))
    assert seen and not any(seen)


def test_core_periphery_mixer_gathers_then_broadcasts():
    """The patches read the cores after the cores read the patches: a change in one patch
    reaches every other patch (two hops), not only itself."""
    torch.manual_seed(0)
    mixer = zoo.CorePeripheryMixer(32, 2, num_cores=4)
    with torch.no_grad():
        for p in (mixer.qk.weight, mixer.v.weight):
            p.normal_(std=0.5)
    x = torch.randn(1, 5 * 7, 32)
    y = x.clone()
    y[0, 0] += 1.0
    with torch.no_grad():
        diff = (mixer(x, (5, 7)) - mixer(y, (5, 7))).abs().sum(-1)[0]  # [N]
    far = diff[20:]  # tokens beyond the LePE's 3x3 reach of token 0
    assert (far > 1e-4).all()


def test_per_stage_options_and_errors():
    model = SEMA(arch=MINI, attn_type='core_periphery', mixer_cfg=dict(num_cores=[2, 3, 4, 5]))
    assert [layer.blocks[0].attn.num_cores for layer in model.layers] == [2, 3, 4, 5]
    with pytest.raises(ValueError, match='per-stage'):
        SEMA(arch=MINI, attn_type='core_periphery', mixer_cfg=dict(num_cores=[2, 3]))
    with pytest.raises(ValueError, match=r"'dynamic' does not take \['num_cores'\]"):
        SEMA(arch=MINI, attn_type='dynamic', mixer_cfg=dict(num_cores=4))
    with pytest.raises(ValueError, match='mixer_cfg must be a dict'):
        SEMA(arch=MINI, mixer_cfg=[('num_cores', 4)])
    with pytest.raises(ValueError, match='attn_type must be one of'):
        SEMA(arch=MINI, attn_type='swin')
    assert 'num_cores' in zoo.mixer_options('core_periphery')
    with pytest.raises(KeyError, match='already registered'):
        zoo.register_mixer('sema')(lambda dim, num_heads: nn.Identity())


@pytest.mark.parametrize('attn_type', ['sema', 'laplacian', 'core_periphery', 'dynamic'])
def test_mixer_triton_backend_matches_reference(attn_type, monkeypatch):
    """The mixer's op calls through the Triton kernels (compiled on GPU, interpreted on CPU)."""
    pytest.importorskip('triton')
    monkeypatch.delenv('MMEFFATTN_OPS_BACKEND')
    torch.manual_seed(0)
    ref = zoo.build_mixer(attn_type, 32, 1, stage=2, window_size=3, backend='reference').eval()
    tri = zoo.build_mixer(attn_type, 32, 1, stage=2, window_size=3, backend='triton').eval()
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(1, 5 * 6, 32)
    with torch.no_grad():
        expected = ref(x, (5, 6))
        got = tri(x, (5, 6))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def _zoo_laplacian(**kwargs):
    torch.manual_seed(0)
    return SEMA(arch=dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]),
                attn_type='laplacian', drop_path_rate=0., **kwargs)


def test_laplacian_mixer_with_cp_counts_the_batch_once(monkeypatch):
    """Gradient checkpointing recomputes a block in backward: the whitening's running
    statistics must see the batch once (as without checkpointing), in any family's blocks."""
    from backbone_checks import assert_with_cp_equivalent
    plain, ckpt = _zoo_laplacian().train(), _zoo_laplacian(with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    assert_with_cp_equivalent(plain, ckpt, torch.randn(2, 3, 64, 64), None, monkeypatch)


def test_laplacian_mixer_norm_eval_freezes_the_whitening():
    model = _zoo_laplacian(norm_eval=True).train()
    before = {k: v.clone() for k, v in model.state_dict().items() if 'running' in k}
    assert any('whiten' in k for k in before)
    with torch.no_grad():
        model(torch.randn(2, 3, 64, 64))
    for k, v in before.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)
