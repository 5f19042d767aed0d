"""The contract every registered backbone family keeps (OpenMMLab's backbone conventions).

Parametrized over :func:`mmeffattn.models.backbones.base.backbone_families`: a new family joins by
being registered in ``mmeffattn.registry.MODELS`` as a :class:`BaseBackbone` with a
``mini_arch``. Each family's own behaviour stays in its tests/models/test_<family>.py.
"""
import logging
import re

import pytest
import torch

from backbone_checks import (assert_pretrained_none_keeps_init, assert_with_cp_equivalent,
                             check_norm_state, freeze_and_train)
from mmeffattn.models.backbones.base import backbone_families
from mmeffattn.registry import MODELS
from official_layouts import init_weights_logged

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

FAMILIES = backbone_families()
NAMES = sorted(FAMILIES)


def build(name: str, **kwargs) -> torch.nn.Module:
    cls = FAMILIES[name]
    torch.manual_seed(0)
    return cls(arch=cls.mini_arch, **{**cls.mini_kwargs, 'drop_path_rate': 0., **kwargs})


@pytest.fixture(scope='module')
def eval_models():
    torch.manual_seed(0)
    return {}


def eval_model(cache: dict, name: str) -> torch.nn.Module:
    if name not in cache:
        cache[name] = build(name).eval()
    return cache[name]


def n_outputs(model) -> int:
    pyramid = getattr(model, 'pyramid', None)
    return pyramid.num_levels if pyramid is not None else len(model.out_indices)


def test_every_family_is_covered():
    assert {'SEMA', 'MILA', 'WeightFormer', 'LaplacianFormer', 'VECA'} <= set(NAMES)
    for name, cls in FAMILIES.items():
        assert isinstance(cls.mini_arch, dict), f'{name} declares no mini_arch'


@pytest.mark.parametrize('name', NAMES)
def test_builds_from_registry_and_rejects_bad_options(name):
    cls = FAMILIES[name]
    with torch.device('meta'):
        model = MODELS.build(dict(type=f'mmeffattn.{name}', arch=cls.mini_arch, **cls.mini_kwargs))
    assert type(model) is cls
    with pytest.raises(KeyError, match=r"Unknown arch 'huge'.*choose one of"):
        cls(arch='huge')
    with pytest.raises(ValueError, match='A custom arch .* must be a dict with keys'):
        cls(arch={'embed_dims': 8})
    # a misspelt (or another family's) setting is named, not ignored
    with pytest.raises(ValueError, match=r"has keys it does not take: \['window_size'\]"):
        cls(arch=dict(cls.mini_arch, window_size=3))
    with pytest.raises(ValueError, match=r'frozen_stages must be an integer in \[-1, '):
        build(name, frozen_stages=model.num_freezable + 1)


@pytest.mark.parametrize('hw', [(45, 61), (17, 33)], ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('name', NAMES)
def test_output_shapes_on_odd_sizes(eval_models, name, hw):
    model = eval_model(eval_models, name)
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *hw))
    assert isinstance(outs, tuple) and len(outs) == n_outputs(model)
    for o in outs:
        assert o.dim() == 4 and o.shape[0] == 2 and torch.isfinite(o).all()
        # a stride s in 4..32: the map covers the image padded to a multiple of s (or of the
        # 16-pixel patch an isotropic trunk's pyramid upsamples from), nothing more
        h, w = o.shape[-2:]
        assert any(hw[0] <= h * s < hw[0] + max(s, 16) and hw[1] <= w * s < hw[1] + max(s, 16)
                   for s in (4, 8, 16, 32)), (tuple(o.shape), hw)


@pytest.mark.parametrize('name', NAMES)
def test_eval_and_train_return_the_module(eval_models, name):
    model = build(name)
    assert model.eval() is model and not model.training
    assert model.train() is model and model.training


@pytest.mark.parametrize('which', ['stem', 'one', 'all'])
@pytest.mark.parametrize('name', NAMES)
def test_frozen_stages_freeze_and_stay_frozen(name, which):
    probe = build(name)
    frozen_stages = {'stem': 0, 'one': 1, 'all': probe.num_freezable}[which]
    model = build(name, frozen_stages=frozen_stages).train()
    frozen = model.frozen_modules()
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    trainable = [p for p in model.parameters() if id(p) not in frozen_ids]
    assert all(p.requires_grad for p in trainable)
    frozen_names = {n for n, t in model.state_dict(keep_vars=True).items()
                    if any(t is u for m in frozen for u in [*m.parameters(), *m.buffers()])}
    before, after = freeze_and_train(model, frozen, [], torch.randn(2, 3, 40, 36))
    assert frozen_names
    for k in frozen_names:  # weights and running statistics
        assert torch.equal(before[k], after[k]), k
    if trainable:
        assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen_names)
    model.train()  # re-applied on every train()
    assert all(not m.training for m in frozen)


@pytest.mark.parametrize('name', NAMES)
def test_norm_eval(name):
    model = build(name, norm_eval=True).train()
    assert model.training
    assert check_norm_state(model.modules(), False)
    assert any(isinstance(m, torch.nn.LayerNorm) and m.training for m in model.modules())
    assert check_norm_state(build(name, norm_eval=False).train().modules(), True)


@pytest.mark.parametrize('name', NAMES)
def test_with_cp_same_outputs_and_grads(name, monkeypatch):
    ref = build(name).train()
    cp_model = build(name, with_cp=True).train()
    cp_model.load_state_dict(ref.state_dict())
    assert_with_cp_equivalent(ref, cp_model, torch.randn(2, 3, 40, 36), None, monkeypatch)


# ------------------------------------------------------------------------------- weights
def _save(state: dict, path, prefix: str = '') -> str:
    torch.save({'meta': {}, 'state_dict': {prefix + k: v for k, v in state.items()}}, path)
    return str(path)


def _randomized_state(model) -> dict:
    gen = torch.Generator().manual_seed(1)
    return {k: (torch.randn(v.shape, generator=gen) if v.is_floating_point() else v)
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_with_prefix_loads_exactly(name, tmp_path):
    state = _randomized_state(build(name))
    path = str(tmp_path / 'det.pth')  # a detector-like checkpoint: backbone and neck
    torch.save({'state_dict': {**{'backbone.' + k: v for k, v in state.items()},
                               'neck.x': torch.zeros(1)}}, path)
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    model.init_weights()
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_wrong_or_missing_prefix_is_explained(name, tmp_path):
    path = _save(build(name).state_dict(), tmp_path / 'det.pth', 'backbone.')
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError,
                       match=r"missing keys.*lie under 'backbone\.'.*prefix='backbone\.'"):
        model.init_weights()
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path, prefix='model.'))
    with pytest.raises(RuntimeError, match=r"starts with prefix 'model\.'.*'backbone\.'"):
        model.init_weights()


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_unexpected_key_raises(name, tmp_path):
    """Strict means strict: an extra tensor is an error, not a warning."""
    state = dict(build(name).state_dict(), **{'blocks.99.extra.weight': torch.zeros(1)})
    path = _save(state, tmp_path / 'extra.pth')
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError, match=r"1 unexpected keys \['blocks\.99\.extra\.weight'\]"):
        model.init_weights()


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_other_family_raises_and_names_it(name, tmp_path):
    other = NAMES[(NAMES.index(name) + 1) % len(NAMES)]
    if {name, other} == {'MILA', 'SEMA'}:
        other = 'WeightFormer' if name != 'WeightFormer' else 'VECA'
    path = _save(build(other).state_dict(), tmp_path / 'other.pth')
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=rf'does not match {name}.*missing keys.*'
                                           rf'unexpected keys.*looks like a {other} checkpoint'):
        model.init_weights()
    for k, v in model.state_dict().items():  # a failed load changes nothing
        assert torch.equal(v, before[k]), k


PAIRS = [(a, b) for a in NAMES for b in NAMES if a != b and {a, b} != {'MILA', 'SEMA'}]


@pytest.mark.parametrize('name,other', PAIRS, ids=[f'{b}-into-{a}' for a, b in PAIRS])
def test_every_other_family_is_named(name, other, tmp_path):
    """Each family's checkpoint, loaded (with the right prefix) into each other family, is named
    as what it is (SEMA's value-projection check once read a WeightFormer checkpoint as MILA's
    and a VECA one as SEMA's)."""
    path = _save(build(other).state_dict(), tmp_path / 'other.pth', 'backbone.')
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    with pytest.raises(RuntimeError, match=rf'looks like a {other} checkpoint, not a {name} one'):
        model.init_weights()


@pytest.mark.parametrize('name,arch,other_arch', [('SEMA', 's', 't'), ('WeightFormer', 't', 's')])
def test_checkpoint_of_another_arch_names_it(name, arch, other_arch, tmp_path):
    """A checkpoint of another arch of the same family: the error names the arch it fits (its
    keys and shapes), not another family."""
    with torch.device('meta'):
        state = FAMILIES[name](arch=other_arch).state_dict()
    path = _save({k: torch.zeros(v.shape, dtype=v.dtype) for k, v in state.items()},
                 tmp_path / 'ckpt.pth', 'backbone.')
    model = FAMILIES[name](arch=arch, init_cfg=dict(type='Pretrained', checkpoint=path,
                                                     prefix='backbone.'))
    with pytest.raises(RuntimeError, match=rf"fits {name}\(arch='{other_arch}'\), not this model"):
        model.init_weights()


def test_whole_model_checkpoint_without_prefix_is_not_called_foreign(tmp_path):
    """Our own classifier checkpoint given without its prefix: the error points at the prefix,
    not at 'weights of another architecture'."""
    path = _save(build('SEMA').state_dict(), tmp_path / 'cls.pth', 'backbone.')
    model = build('SEMA', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError, match=r"lie under 'backbone\.'") as info:
        model.init_weights()
    assert 'another architecture' not in str(info.value)


@pytest.mark.parametrize('name', NAMES)
def test_fully_frozen_backbone_without_checkpoint_is_refused(name):
    """A linear probe whose checkpoint was not set trained its head on random features with
    only an INFO line; now it stops, unless allowed (smoke tests). A partly frozen backbone
    still trains from scratch."""
    probe = build(name)
    init = dict(type='Pretrained', checkpoint=None)
    model = build(name, frozen_stages=probe.num_freezable, init_cfg=init)
    for p in model.parameters():  # (the mini configs add a trainable pyramid for detection)
        p.requires_grad_(False)
    with pytest.raises(RuntimeError, match=rf'{name}: every parameter is frozen .*checkpoint='
                                           r'None.*init_cfg\.allow_random=True'):
        model.init_weights()
    model.init_cfg = dict(init, allow_random=True)
    model.init_weights()
    build(name, frozen_stages=0, init_cfg=init).init_weights()


def test_sema_checkpoint_into_mila_names_the_cause(tmp_path):
    """issue 13: this loaded with only a WARNING ('ignoring 36 unexpected keys')."""
    path = _save(FAMILIES['SEMA'](arch='tiny').state_dict(), tmp_path / 'sema.pth', 'backbone.')
    model = FAMILIES['MILA'](arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path,
                                                        prefix='backbone.'))
    with pytest.raises(RuntimeError, match=r'36 unexpected keys.*attn\.v\..*looks like a SEMA '
                                           r'checkpoint: MILA .* no value projection'):
        model.init_weights()
    path = _save(build('MILA').state_dict(), tmp_path / 'mila.pth')
    model = build('SEMA', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(RuntimeError, match='looks like a MILA/MLLA checkpoint'):
        model.init_weights()


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_strict_false_loads_what_fits_and_warns(name, tmp_path):
    """``strict=False`` is mmengine's own non-strict load (PretrainedInit's): what fits is loaded,
    the rest is named in a WARNING."""
    src = _randomized_state(build(name))
    key = next(k for k, v in src.items() if v.is_floating_point() and v.dim() > 1)
    state = {k: v for k, v in src.items() if k != key}
    state['blocks.99.extra.weight'] = torch.zeros(1)
    path = _save(state, tmp_path / 'partial.pth')
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=path, strict=False))
    init = model.state_dict()[key].clone()
    warnings = [m for _, m in init_weights_logged(model, logging.WARNING)]
    assert any('unexpected key in source state_dict: blocks.99.extra.weight' in w and
               f'missing keys in source state_dict: {key}' in w for w in warnings), warnings
    assert torch.equal(model.state_dict()[key], init)
    other = next(k for k in state if k != 'blocks.99.extra.weight' and state[k].dim() > 1)
    assert torch.equal(model.state_dict()[other], state[other])


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_without_checkpoint_keeps_init(name):
    cls = FAMILIES[name]
    assert_pretrained_none_keeps_init(cls, arch=cls.mini_arch, **cls.mini_kwargs)


# ------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize('name', NAMES)
def test_bad_inputs_raise_one_clear_error(eval_models, name):
    model = eval_model(eval_models, name)
    shape_msg = rf'{name} expects an input of shape \[B, 3, H, W\], got '
    for shape in [(3, 32, 32), (1, 1, 32, 32), (1, 3, 1, 32, 32)]:
        with pytest.raises(ValueError, match=shape_msg + re.escape(str(shape))):
            model(torch.randn(*shape))
    # batch 0: rejected by every family with the same message
    with pytest.raises(ValueError, match=rf'{name} got an empty input of shape '
                                         r'\(0, 3, 32, 32\): it needs at least one image'):
        model(torch.randn(0, 3, 32, 32))
    with pytest.raises(TypeError, match=r'float32 weights but got a torch.float16 input: run it '
                                        r'under torch.autocast.*model\.to\(torch.float16\)'):
        model(torch.randn(1, 3, 32, 32).half())
    # fp64: no autocast advice (autocast takes 16-bit dtypes only)
    with pytest.raises(TypeError, match=r'float32 weights but got a torch.float64 input: convert '
                                        r'the model \(model.to\(torch.float64\)\)'):
        model(torch.randn(1, 3, 32, 32).double())
    with pytest.raises(TypeError, match='floating-point image'):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize('name', NAMES)
def test_bf16_autocast_finite(eval_models, name):
    model = eval_model(eval_models, name)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 40, 36))
    assert all(torch.isfinite(o.float()).all() for o in outs)


@pytest.mark.parametrize('name', NAMES)
def test_half_model_runs_on_half_input(name):
    """``model.half()`` with a half input (the fix the fp16 error names) runs on the CPU too."""
    model = build(name).half().eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 40, 36).half())
    assert all(o.dtype == torch.float16 and torch.isfinite(o).all() for o in outs)
