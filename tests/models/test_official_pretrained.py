"""Official checkpoints through ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``, and the
deprecated ``pretrained=`` argument (mmeffattn/models/utils/pretrained.py, base.py).

Each official layout (MLLA, WeightFormer, VECA) is written here from a seeded model of ours by
inverting the documented key mapping of the family's converter (the official code is never
imported); a second model loads that file through ``Pretrained`` and must give the same outputs.
"""
import logging
import re
import warnings

import pytest
import torch
from mmengine.logging import MMLogger

import mmeffattn.models  # noqa: F401  (registers the families)
from mmeffattn.models.backbones.base import pretrained_to_init_cfg
from mmeffattn.models.backbones.sema import MILA, SEMA
from mmeffattn.models.backbones.veca import VECA
from mmeffattn.models.backbones.weightformer import WeightFormer, is_dynamic_block
from mmeffattn.models.utils.pretrained import official_layout_of

pytestmark = pytest.mark.usefixtures('one_thread', 'reference_ops')


# ------------------------------------------------------------------ official layouts, inverted
def to_official_mlla(sd: dict) -> dict:
    """Ours -> an official MLLA classification checkpoint: the same names, plus the classifier,
    the classification norm and a fixed-size RoPE table (all three dropped on load); no
    per-output norms."""
    out = {k: v for k, v in sd.items() if not re.match(r'norm\d+\.', k)}
    c = sd['layers.3.blocks.0.norm1.weight'].numel()
    out.update({'norm.weight': torch.ones(c), 'norm.bias': torch.zeros(c),
                'head.weight': torch.randn(10, c), 'head.bias': torch.zeros(10),
                'layers.0.blocks.0.attn.rope.rotations': torch.randn(7, 7, 8)})
    return {'model': out}


def to_official_weightformer(sd: dict, depth: int) -> dict:
    """Ours -> official ``model/wfm.py`` names (the converter's table, read right to left)."""
    out = {}
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(.+)$', k)
        if k.startswith('patch_embed.proj.'):
            out[k] = v
        elif k.startswith('patch_embed.norm.'):
            out['init_norm.' + k.split('.')[-1]] = v
        elif k.startswith(f'norm{depth - 1}.'):
            out['norm.' + k.split('.')[-1]] = v
        elif m:
            i, rest = int(m.group(1)), m.group(2)
            dyn = is_dynamic_block(i)
            rest = (rest.replace('mlp.fc2.', 'linear2.').replace('kernel_gen.', 'wfm.')
                    .replace('mlp.fc1.token_proj.', 'linear1.wfm.')
                    .replace('mlp.fc1.in_basis', 'linear1.w1')
                    .replace('mlp.fc1.out_basis', 'linear1.w2'))
            if dyn and rest == 'mlp.fc1.weight':
                rest, v = 'linear1.w', v.t().contiguous()  # official w is [in, out]
            elif dyn and rest == 'mlp.fc1.bias':
                rest = 'linear1.b'
            elif dyn and rest in ('dwc.weight', 'dwc.bias'):
                rest = 'dwc.' + rest[4]  # dwc.w / dwc.b
            rest = rest.replace('mlp.fc1.', 'linear1.')
            out[f'blocks.{i}.{rest}'] = v
        else:
            raise AssertionError(f'unexpected key {k}')
    c = sd['patch_embed.proj.bias'].numel()
    out.update({'head.weight': torch.randn(10, c), 'head.bias': torch.zeros(10)})
    return {'model': out}


_VECA_BLOCK = {'norm1': 'norm_attn', 'norm2': 'norm_ffn', 'attn.q': 'attn.q_proj',
               'attn.k': 'attn.k_proj', 'attn.v': 'attn.v_proj', 'attn.proj': 'attn.out_proj',
               'ffn.fc1': 'fc1', 'ffn.fc2': 'fc2'}


def to_official_veca(sd: dict, depth: int) -> dict:
    """Ours -> an official VECA training checkpoint (weights under ``student``)."""
    out, alpha = {}, {}
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(norm1|norm2|attn\.\w+|ffn\.fc\d)\.(\w+)$', k)
        c = re.match(r'blocks\.(\d+)\.coord_head\.(fc\.(\w+)|alpha)$', k)
        if m:
            out[f'blocks.{m.group(1)}.{_VECA_BLOCK[m.group(2)]}.{m.group(3)}'] = v
        elif c and c.group(2) == 'alpha':
            alpha[int(c.group(1))] = v
        elif c:
            out[f'pos_linears.{int(c.group(1)) - 1}.{c.group(3)}'] = v
        elif k.startswith('core_tokens.'):
            out['query_token_chunks.' + k.split('.')[1]] = v
        elif k.startswith('core_coords.'):
            out['qcoord_chunks.' + k.split('.')[1]] = v
        elif k.startswith(f'norm{depth - 1}.'):
            out['final_norm.' + k.split('.')[-1]] = v
        elif k.startswith('patch_embed.'):
            out[k] = v
        else:
            raise AssertionError(f'unexpected key {k}')
    out['pos_alpha'] = torch.stack([alpha[i] for i in range(1, depth)])
    return {'student': out, 'optimizer': {}, 'config': {'model_family': 'custom'}}


def _seeded(cls, keep=None, **kwargs):
    """A seeded model whose parameters are moved off their init (so that a missed key shows),
    except those matching ``keep`` (the parts an official checkpoint lacks keep their init)."""
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if keep is None or not re.match(keep, name):
                p.add_(torch.randn_like(p) * .02)
    return model


CASES = {
    # the official MLLA classifier has no per-output norms: they keep their init
    'MLLA': (MILA, dict(arch=MILA.mini_arch, drop_path_rate=0., keep=r'norm\d+\.'),
             lambda m: to_official_mlla(m.state_dict()), (1, 3, 64, 64)),
    'WeightFormer': (WeightFormer, dict(arch=WeightFormer.mini_arch, out_type='featmap',
                                        out_indices=(-1, )),
                     lambda m: to_official_weightformer(m.state_dict(), m.depth), (1, 3, 48, 64)),
    'VECA': (VECA, dict(arch=VECA.mini_arch, out_type='raw', num_cores=16,
                        nested_dropout=False),
             lambda m: to_official_veca(m.state_dict(), m.arch_settings['depth']),
             (1, 3, 48, 64)),
}


@pytest.mark.parametrize('layout', list(CASES))
def test_official_checkpoint_loads_through_pretrained(tmp_path, layout):
    cls, kwargs, to_official, shape = CASES[layout]
    src = _seeded(cls, **kwargs)
    path = str(tmp_path / f'official_{layout}.pth')
    official = to_official(src)
    torch.save(official, path)
    assert official_layout_of(cls, official).name == layout

    # our configs set prefix='backbone.'; an official (bare) checkpoint loads all the same
    kwargs = {k: v for k, v in kwargs.items() if k != 'keep'}
    dst = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    logger, records = MMLogger.get_current_instance(), []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: records.append(r.getMessage())
    logger.addHandler(handler)
    try:
        dst.init_weights()
    finally:
        logger.removeHandler(handler)
    assert any(f'official {layout} checkpoint' in r and 'converted it on load' in r
               for r in records), records
    dst.eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for a, b in zip(torch.utils._pytree.tree_leaves(src(x)),
                        torch.utils._pytree.tree_leaves(dst(x))):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_our_checkpoints_are_not_taken_for_official(tmp_path):
    """A checkpoint of ours (and a whole-model one) is never converted."""
    for cls, kwargs, _, _ in CASES.values():
        sd = _seeded(cls, **kwargs).state_dict()  # (keep is _seeded's)
        assert official_layout_of(cls, sd) is None
        assert official_layout_of(cls, {'state_dict': {'backbone.' + k: v
                                                       for k, v in sd.items()}}) is None
    # another family's official layout is not this family's
    wf = to_official_weightformer(_seeded(WeightFormer, **CASES['WeightFormer'][1]).state_dict(),
                                  WeightFormer.mini_arch['depth'])
    assert official_layout_of(SEMA, wf) is None


# ------------------------------------------------------------------ deprecated pretrained=
def test_pretrained_argument_becomes_init_cfg():
    with pytest.warns(DeprecationWarning, match='pretrained is deprecated'):
        m = MILA(arch=MILA.mini_arch, pretrained='some.pth')
    assert m.init_cfg == dict(type='Pretrained', checkpoint='some.pth')
    m = SEMA(arch=SEMA.mini_arch, pretrained=None)
    assert m.init_cfg is None
    with pytest.raises(ValueError, match='both pretrained'):
        WeightFormer(arch=WeightFormer.mini_arch, pretrained='a.pth',
                     init_cfg=dict(type='Pretrained', checkpoint=None))
    with pytest.raises(TypeError, match='pretrained must be'):
        pretrained_to_init_cfg('X', 3, None)
    # every registered family takes it, through its own __init__ (nothing else changes)
    from mmeffattn.models.backbones.base import backbone_families
    for name, cls in backbone_families().items():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            m = cls(arch=cls.mini_arch, **cls.mini_kwargs, pretrained='w.pth')
        assert m.init_cfg['checkpoint'] == 'w.pth', name


def test_model_zoo_name_fails_with_the_fix():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        m = MILA(arch=MILA.mini_arch, pretrained='open-mmlab://resnet50_v1c')
    with pytest.raises(RuntimeError, match=r'another architecture.*model\.pretrained=None'):
        m.init_weights()


def test_undownloadable_url_fails_with_the_fix(tmp_path, monkeypatch):
    # a closed local port: refused at once, as any download is here
    monkeypatch.setenv('TORCH_HOME', str(tmp_path))
    m = MILA(arch=MILA.mini_arch,
             init_cfg=dict(type='Pretrained', checkpoint='http://127.0.0.1:9/mlla_t.pth'))
    with pytest.raises(RuntimeError, match=r'cannot download checkpoint.*without network access'
                                           r'.*LOCAL_PATH'):
        m.init_weights()


def test_foreign_weights_say_another_architecture(tmp_path):
    path = str(tmp_path / 'resnet.pth')
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7),
                               'layer1.0.conv1.weight': torch.zeros(64, 64, 1, 1)}}, path)
    m = SEMA(arch=SEMA.mini_arch, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError, match=r'another architecture.*model\.pretrained=None'):
        m.init_weights()
