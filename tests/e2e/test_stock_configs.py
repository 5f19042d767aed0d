"""A stock mmseg config with one of our backbones swapped in (``_delete_=True``), as a user writes
it: mmseg's ``upernet_r50_4xb4-160k_ade20k-512x512.py`` keeps its model-level
``pretrained='open-mmlab://resnet50_v1c'``, which mmseg's ``EncoderDecoder`` hands to the backbone.

The backbone takes it (deprecated ``pretrained=``), and loading those ResNet weights fails with an
error naming the fix, ``model.pretrained=None``; with that option, mmseg's own ``tools/train.py``
(shipped in the installed mmseg under ``.mim/tools``) trains a few iterations on
../shared/data/ade20k_sample.
"""
import os
import os.path as osp

import pytest

from e2e_helpers import NO_EVAL, ROOT, run_tool, stock_train_py

STOCK = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'

# the swap as the README shows it: a small SEMA so that the test stays fast
SWAP = f'''
_base_ = {STOCK!r}
custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)
model = dict(
    backbone=dict(_delete_=True, type='mmeffattn.SEMA',
                  arch=dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]),
                  drop_path_rate=0.1, out_indices=(0, 1, 2, 3)),
    decode_head=dict(in_channels=[32, 64, 128, 256], channels=32),
    auxiliary_head=dict(in_channels=128, channels=16))
'''

# the sample data at a tiny crop, 2 iterations
SMALL_ADE = '''
data_root = {root!r}
crop_size = (64, 64)
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(128, 64), ratio_range=(0.75, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='PackSegInputs'),
]
paths = dict(img_path='images/validation', seg_map_path='annotations/validation')
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, data_prefix=paths, pipeline=train_pipeline))
train_cfg = dict(max_iters=2, val_interval=100)
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=2, by_epoch=False)]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))
''' + NO_EVAL


def test_stock_swap_builds_and_names_the_fix(tmp_path):
    """Built as-is, the swapped stock config gets past the backbone's ``__init__`` (mmseg's
    ``pretrained`` is accepted) and ``init_weights`` refuses the ResNet weights, without a
    download, naming ``model.pretrained=None``."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    path = tmp_path / 'swap.py'
    path.write_text(SWAP)
    cfg = Config.fromfile(str(path))
    assert cfg.model.pretrained == 'open-mmlab://resnet50_v1c'
    cfg.model.backbone.norm_cfg = dict(type='BN')  # no process group here
    for head in ('decode_head', 'auxiliary_head'):
        cfg.model[head].norm_cfg = dict(type='BN')
    init_default_scope('mmseg')
    import mmeffattn  # noqa: F401  (custom_imports)
    model = MODELS.build(cfg.model)
    assert model.backbone.init_cfg == dict(type='Pretrained',
                                           checkpoint='open-mmlab://resnet50_v1c')
    with pytest.raises(RuntimeError, match=r'another architecture.*model\.pretrained=None'):
        model.init_weights()


@pytest.mark.e2e
def test_stock_swap_trains_with_mmseg_train_py(tmp_path, shared_data):
    root = shared_data('ade20k_sample') + '/'
    cfg = tmp_path / 'swap_small.py'
    cfg.write_text(SWAP + SMALL_ADE.format(root=root))
    work = str(tmp_path / 'work')
    env = dict(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    proc = run_tool([stock_train_py('mmseg'), str(cfg), '--work-dir', work,
                     '--cfg-options', 'model.pretrained=None'], env=env)
    assert osp.isfile(osp.join(work, 'iter_2.pth')), proc.stdout[-2000:]
    assert 'Iter(train) [2/2]' in proc.stdout + proc.stderr
