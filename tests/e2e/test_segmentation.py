"""UperNet end to end: train, evaluate mIoU, learn (a few updates already beat the same run at
learning rate 0 on the same images). On generated shapes in ADE20K's layout in any clone, and on
../shared/data/ade20k_sample where it is present."""
import glob
import json
import os.path as osp

import pytest

from e2e_helpers import (assert_beats_baseline, assert_loss_falls, learning_config, mini_backbone,
                         run_tool, train_losses)
from mmeffattn.analysis.logs import load_log

pytestmark = pytest.mark.e2e

SMALL_ADE = '''
data_root = {root!r}
crop_size = (128, 128)
data_preprocessor = dict(size=crop_size)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
paths = dict(img_path='images/validation', seg_map_path='annotations/validation')
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, data_prefix=paths, pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, data_prefix=paths, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters={iters}, val_interval={iters})
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end={iters},
                        by_epoch=False)]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval={iters}))
model = {model!r}
'''
#: iterations per data tier (of a mini model on the generated shapes: cheap)
ITERS = {'generated': 4, 'real': 2}
#: a mini model's few parameters move its loss little at the recipe's 6e-5: a larger step
MINI_LR = "optim_wrapper = dict(optimizer=dict(lr=5e-3))\n"


def segmentor_model(config: str, tier: str) -> dict:
    """The model overrides: the crop size; on generated data, the family's mini backbone under
    narrow UperNet heads."""
    model = dict(data_preprocessor=dict(size=(128, 128)))
    if tier == 'generated':
        backbone, channels = mini_backbone(config)
        model.update(backbone=backbone, decode_head=dict(in_channels=channels, channels=16),
                     auxiliary_head=dict(in_channels=channels[2], channels=16))
    return model


# One family by default (VECA: cores + patches at a non-square crop) on each tier, every family
# with --run-slow; tests/models/test_backbone_contract.py covers each family in-process.
SEGMENTORS = [
    ('configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py', 'upernet-sema-t', True),
    ('configs/weightformer/weightformer-t_upernet_8xb2-160k_ade20k-512x512.py',
     'upernet-weightformer-t', True),
    ('configs/laplacianformer/laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py',
     'upernet-laplacianformer-t', True),
    ('configs/veca/veca-s_upernet_8xb2-160k_ade20k-512x512.py', 'upernet-veca-s', False),
]


@pytest.mark.parametrize('config, tier', [
    pytest.param(config, tier, id=f'{name}-{tier}', marks=pytest.mark.slow if slow else ())
    for config, name, slow in SEGMENTORS for tier in ('generated', 'real')])
def test_upernet(tmp_path, config, tier, sample_data):
    root = sample_data('ade20k', tier)
    iters = ITERS[tier]
    body = SMALL_ADE.format(root=root, iters=iters, model=segmentor_model(config, tier))
    body += MINI_LR if tier == 'generated' else ''
    cfg = learning_config(tmp_path / 'cfg.py', config, body)
    work = str(tmp_path / 'work')
    run_tool(['tools/train.py', cfg, '--work-dir', work])
    ckpt = osp.join(work, f'iter_{iters}.pth')
    assert osp.isfile(ckpt)
    # the log read back as tools/analysis_tools/analyze_logs.py reads it: this
    # iteration-based loop's validation (logged at step 0) placed at the last iteration
    log = load_log(work)
    x, y, x_label = log.series('mIoU')
    assert (x, x_label) == ([iters], 'iteration')
    assert log.series('loss')[0] == list(range(1, iters + 1))
    # tools/test.py on the checkpoint reaches the mIoU the training run validated at the end,
    # and draws its predictions; it needs no training set (mmseg's visualization hook reads
    # runner.iter, which built the training loop and its data loader until tools/test.py
    # dropped them)
    out_json = str(tmp_path / 'metrics.json')
    run_tool(['tools/test.py', cfg, ckpt, '--work-dir', work, '--out-json', out_json,
              '--show-dir', str(tmp_path / 'vis'), '--cfg-options',
              f'train_dataloader.dataset.data_root={tmp_path / "no_training_set"}'])
    metrics = json.load(open(out_json))['metrics']
    assert metrics['mIoU'] == pytest.approx(y[0], abs=0.01)  # the log rounds to 2 decimals
    assert glob.glob(str(tmp_path / 'vis' / '**' / '*.png'), recursive=True), 'nothing drawn'

    # it learns: the same run at learning rate 0 (same seed, weights, crops) reaches less
    work0 = str(tmp_path / 'work_lr0')
    run_tool(['tools/train.py', learning_config(tmp_path / 'cfg0.py', config, body, lr0=True),
              '--work-dir', work0])
    # measured: 1.7% (real), 2.3% (generated)
    assert_loss_falls(train_losses(work), train_losses(work0), drop=0.005)
    assert_beats_baseline('mIoU', metrics['mIoU'], load_log(work0).series('mIoU', 'val')[1][-1])
