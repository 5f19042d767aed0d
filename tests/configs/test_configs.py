"""Every config under configs/ loads, and its model builds through the downstream registry."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope

import mmeffattn  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))


def _id(path: str) -> str:
    return osp.relpath(path, osp.join(ROOT, 'configs'))


def test_main_config_is_the_3x_recipe_plus_the_opt_in():
    """The headline config is sema/mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py with only the
    imports changed (its header says so): same model, data and schedule."""
    main = Config.fromfile(osp.join(ROOT, 'configs', 'mask_rcnn_sema_t_3x.py')).to_dict()
    recipe = Config.fromfile(
        osp.join(ROOT, 'configs', 'sema', 'mask-rcnn_sema-t_fpn_ms-crop-3x_coco.py')).to_dict()
    assert {k for k in main.keys() | recipe.keys() if main.get(k) != recipe.get(k)} <= {
        'custom_imports'}
    assert main['model']['type'] == 'MaskRCNN' and main['train_cfg']['max_epochs'] == 36
    assert main['model']['backbone']['type'] == 'mmeffattn.SEMA'
    assert main['custom_imports']['imports'][0] == 'mmeffattn'


def _param(path: str):
    # the zoo's Mask R-CNN configs differ from the zoo classifiers only in the downstream model,
    # and tests/models/test_attention_zoo.py builds every mixer in mmdet: sweep them with the
    # slow tests to keep the default suite short
    slow = 'zoo' in _id(path).split(osp.sep)[0] and 'mask-rcnn' in osp.basename(path)
    return pytest.param(path, id=_id(path), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize('path', [_param(p) for p in CONFIGS])
def test_config_builds(path):
    cfg = Config.fromfile(path)
    imports = cfg.custom_imports['imports']  # ours first, then only opt-ins of ours
    assert imports[0] == 'mmeffattn' and all(i.startswith('mmeffattn.') for i in imports[1:])
    # a distillation model trains a student backbone instead of holding a `backbone`
    key = 'student' if 'student' in cfg.model else 'backbone'
    backbone = cfg.model[key]
    assert backbone.type.startswith('mmeffattn.'), backbone.type
    from mmengine.registry import MODELS
    with DefaultScope.overwrite_default_scope(cfg.default_scope):  # no global scope left behind
        model = MODELS.build(cfg.model)
    # the backbone really is ours, with the attention the config asks for
    assert type(getattr(model, key)).__module__.startswith('mmeffattn.')
    if 'attn_type' in backbone:
        assert getattr(model, key).attn_type == backbone.attn_type
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params > 1e6


def test_config_inherits_from_another_package_via_mim(tmp_path):
    """A config outside the project can inherit ours through the package's .mim folder, once
    the opt-in (mmeffattn.engine.patch_mmengine) is imported."""
    import mmeffattn.engine.patch_mmengine  # noqa: F401
    cfg_file = tmp_path / 'my_cfg.py'
    cfg_file.write_text("_base_ = 'mmeffattn::sema/retinanet_sema-t_fpn_1x_coco.py'\n"
                        "model = dict(backbone=dict(drop_path_rate=0.0))\n")
    cfg = Config.fromfile(str(cfg_file)).to_dict()
    ours = Config.fromfile(osp.join(ROOT, 'configs', 'sema', 'retinanet_sema-t_fpn_1x_coco.py'))
    ours = ours.to_dict()
    assert ours['model']['backbone']['drop_path_rate'] != 0.0  # so the override shows
    ours['model']['backbone']['drop_path_rate'] = 0.0
    assert cfg == ours  # our config, found through the package, with the user's change only


def test_mim_inheritance_works_outside_the_project_root(tmp_path):
    """From another directory too: there an editable install's metadata in site-packages, beside
    no ``mmeffattn`` folder, sent mmengine to a missing ``.mim/model-index.yml``."""
    import subprocess
    import sys
    (tmp_path / 'my_cfg.py').write_text(
        "_base_ = 'mmeffattn::sema/mask-rcnn_sema-t_fpn_1x_coco.py'\n")
    code = ('import mmeffattn.engine.patch_mmengine; from mmengine.config import Config; '
            'print(Config.fromfile("my_cfg.py").model.backbone.type)')
    res = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split()[-1] == 'mmeffattn.SEMA', res.stderr[-2000:]


def test_mila_configs_build_the_registered_mila_class():
    """configs/mila use type='mmeffattn.MILA'; the model is the one SEMA(attn_type='linear')
    built before (same parameter names and shapes)."""
    import torch

    from mmeffattn.models.backbones import MILA, SEMA
    mila_cfgs = [p for p in CONFIGS if osp.basename(osp.dirname(p)) == 'mila']
    assert mila_cfgs
    for path in mila_cfgs:
        cfg = Config.fromfile(path).model.backbone
        assert cfg.type == 'mmeffattn.MILA' and cfg.attn_type == 'linear', path
    kwargs = {k: v for k, v in Config.fromfile(mila_cfgs[0]).model.backbone.items()
              if k not in ('type', 'init_cfg')}
    with torch.device('meta'):
        mila = MILA(**kwargs)
        sema_linear = SEMA(**kwargs)
    assert type(mila) is MILA
    assert {k: v.shape for k, v in mila.state_dict().items()} == \
        {k: v.shape for k, v in sema_linear.state_dict().items()}
