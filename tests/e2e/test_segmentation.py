"""UperNet end to end on ../shared/data/ade20k_sample: train, evaluate mIoU, learn (two
updates on the 3 images already beat the same run at learning rate 0 on them)."""
import glob
import json
import os.path as osp

import pytest

from e2e_helpers import (assert_beats_baseline, assert_loss_falls, learning_config, run_tool,
                         train_losses)
from mmeffattn.analysis.logs import load_log

pytestmark = pytest.mark.e2e

SMALL_ADE = '''
data_root = {root!r}
crop_size = (128, 128)
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor)
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
train_cfg = dict(max_iters=2, val_interval=2)
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=2, by_epoch=False)]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))
'''


# One family in the default suite (VECA: cores + patches at a non-square crop), every family
# with --run-slow; tests/models/test_backbone_contract.py covers each family in-process.
@pytest.mark.parametrize('config', [
    pytest.param('configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py', id='upernet-sema-t',
                 marks=pytest.mark.slow),
    pytest.param('configs/weightformer/weightformer-t_upernet_8xb2-160k_ade20k-512x512.py',
                 id='upernet-weightformer-t', marks=pytest.mark.slow),
    pytest.param('configs/laplacianformer/laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py',
                 id='upernet-laplacianformer-t', marks=pytest.mark.slow),
    pytest.param('configs/veca/veca-s_upernet_8xb2-160k_ade20k-512x512.py', id='upernet-veca-s'),
])
def test_upernet_on_ade20k_sample(tmp_path, config, shared_data):
    root = shared_data('ade20k_sample') + '/'
    body = SMALL_ADE.format(root=root)
    cfg = learning_config(tmp_path / 'cfg.py', config, body)
    work = str(tmp_path / 'work')
    run_tool(['tools/train.py', cfg, '--work-dir', work])
    ckpt = osp.join(work, 'iter_2.pth')
    assert osp.isfile(ckpt)
    # the log read back as tools/analysis_tools/analyze_logs.py reads it: this
    # iteration-based loop's validation (logged at step 0) placed at iteration 2
    log = load_log(work)
    x, y, x_label = log.series('mIoU')
    assert (x, x_label) == ([2], 'iteration') and 0. <= y[0] <= 100.
    assert log.series('loss')[0] == [1, 2]
    # tools/test.py on the checkpoint reaches the mIoU the training run validated at iteration 2,
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
    assert_loss_falls(train_losses(work), train_losses(work0), drop=0.005)  # measured: 1.8%
    assert_beats_baseline('mIoU', metrics['mIoU'], load_log(work0).series('mIoU', 'val')[1][-1])
