"""Official checkpoints through ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``, and the
deprecated ``pretrained=`` argument (mmeffattn/models/utils/pretrained.py, base.py).

Each official layout (MLLA, WeightFormer, VECA) is written from a seeded model of ours
(official_layouts.py); a second model loads that file through ``Pretrained`` and must give the
same outputs.
"""
import logging
import warnings

import pytest
import torch

import mmeffattn.models  # noqa: F401  (registers the families)
from mmeffattn.models.backbones.sema import MILA, SEMA
from mmeffattn.models.backbones.weightformer import WeightFormer
from mmeffattn.models.converters import official_layout
from official_layouts import CASES, init_weights_logged, seeded, to_official_weightformer

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')


@pytest.mark.parametrize('layout', list(CASES))
def test_official_checkpoint_loads_through_pretrained(tmp_path, layout):
    cls, kwargs, to_official, shape = CASES[layout]
    src = seeded(cls, **kwargs)
    path = str(tmp_path / f'official_{layout}.pth')
    official = to_official(src)
    torch.save(official, path)
    assert official_layout(official) == layout

    # our configs set prefix='backbone.'; an official (bare) checkpoint loads all the same
    kwargs = {k: v for k, v in kwargs.items() if k != 'keep'}
    dst = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    records = init_weights_logged(dst)
    assert any(f'(whole), its keys converted by {cls.__name__}.checkpoint_filter' in m
               for _, m in records), records
    dst.eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for a, b in zip(torch.utils._pytree.tree_leaves(src(x)),
                        torch.utils._pytree.tree_leaves(dst(x))):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_our_checkpoints_are_not_taken_for_official(tmp_path):
    """A checkpoint of ours (and a whole-model one) is never converted: each family's filter
    leaves its keys as they are, and no official layout is recognised in it."""
    for cls, kwargs, _, _ in CASES.values():
        model = seeded(cls, **kwargs)
        sd = model.state_dict()
        assert official_layout(sd) is None
        assert official_layout({'state_dict': {'backbone.' + k: v for k, v in sd.items()}}) \
            is None
        assert set(model.checkpoint_filter(sd)) == set(sd)
    # another family's official layout is not loaded as this family's: its keys are named
    wf = to_official_weightformer(seeded(WeightFormer, **CASES['WeightFormer'][1]).state_dict(),
                                  WeightFormer.mini_arch['depth'])
    path = str(tmp_path / 'wf.pth')
    torch.save(wf, path)
    m = SEMA(arch=SEMA.mini_arch, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError, match=r'does not match SEMA.*unexpected keys'):
        m.init_weights()


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
    with pytest.raises(TypeError, match='MILA: pretrained must be'):
        MILA(arch=MILA.mini_arch, pretrained=3)
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


# ------------------------------------------------------------------ where weights come from
def _records(build, level=logging.INFO):
    """``(levelno, message)`` of what ``build().init_weights()`` logs."""
    return init_weights_logged(build(), level)


def _classifier(**backbone):
    """mmpretrain's ImageClassifier with a mini SEMA backbone, as a stock config builds it."""
    import mmpretrain.models  # noqa: F401  (registers ImageClassifier and its parts)
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # whatever scope a test left
        return MODELS.build(dict(
            type='ImageClassifier',
            backbone=dict(type='mmeffattn.SEMA', arch=SEMA.mini_arch, out_indices=(3, ),
                          **backbone),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(type='LinearClsHead', num_classes=3,
                      in_channels=SEMA.mini_arch['embed_dims'] * 8)))


def test_downstream_model_with_random_backbone_warns_where_weights_come_from(tmp_path):
    warnings_ = [m for lvl, m in _records(_classifier) if lvl == logging.WARNING]
    assert any('SEMA: no pretrained weights' in m and "type='Pretrained', "
               "checkpoint=URL_OR_PATH" in m and 'docs/user_guides/checkpoints.md' in m
               for m in warnings_), warnings_
    # our configs' default entry (checkpoint=None) warns too; allow_random=True says it is meant
    none = _records(lambda: _classifier(init_cfg=dict(type='Pretrained', checkpoint=None)))
    assert any(lvl == logging.WARNING and 'no pretrained weights' in m for lvl, m in none)
    meant = _records(lambda: _classifier(init_cfg=dict(type='Pretrained', checkpoint=None,
                                                       allow_random=True)))
    assert any(lvl == logging.INFO and 'no pretrained weights' in m for lvl, m in meant), meant
    assert not any(lvl >= logging.WARNING and 'no pretrained weights' in m for lvl, m in meant)
    # with weights, nothing of the kind
    path = str(tmp_path / 'sema.pth')
    torch.save(SEMA(arch=SEMA.mini_arch, out_indices=(3, )).state_dict(), path)
    loaded = _records(lambda: _classifier(init_cfg=dict(type='Pretrained', checkpoint=path)))
    assert not any('no pretrained weights' in m for _, m in loaded), loaded
    assert any('loaded' in m and 'sema.pth' in m for _, m in loaded), loaded
