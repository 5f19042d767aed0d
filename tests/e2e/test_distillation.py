"""VECA distillation config end to end: tools/train.py with a tiny student and a tiny random
teacher, then --resume; the student learns (its loss falls below the same batches' at learning
rate 0). On generated shapes in any clone, and on ../shared/data/imagenet_sample where present."""
import os.path as osp
import re

import pytest
import torch

from e2e_helpers import assert_loss_falls, learning_config, run_tool, train_losses

pytestmark = pytest.mark.e2e

# tiny student (2 blocks of width 32) and teacher (2 blocks of width 48), 8 images
TINY_DISTILL = '''
model = dict(
    student=dict(arch=dict(_delete_=True, embed_dims=32, depth=2, num_heads=2),
                 out_proj_dims=48),
    teacher=dict(type='mmpretrain.VisionTransformer',
                 arch=dict(_delete_=True, embed_dims=48, num_layers=2, num_heads=2,
                           feedforward_channels=96),
                 img_size=64, patch_size=16, out_type='raw'),
    allow_random_teacher=True)
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={root!r}, data_prefix=dict(img_path='val'), max_images=8))
train_cfg = dict(max_epochs=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
# ten times the recipe's rate (its warm-up still starts at 1/8 of it): tiny models' losses move
# little in 3 updates at 5e-5
optim_wrapper = dict(optimizer=dict(lr=4e-3))
'''
# the config's own pipeline, at 64 px crops from a 72 px short side instead of 256 from 288
SMALL_CROPS = ['--cfg-options', 'train_dataloader.dataset.pipeline.1.scale=72',
               'train_dataloader.dataset.pipeline.2.crop_size=64']


CONFIG = 'configs/veca/veca-s_distill_vit-b16-approx-dinov3_in1k.py'


@pytest.mark.parametrize('tier', ['generated', 'real'])
def test_distill_trains_and_resumes(tmp_path, tier, sample_data):
    body = TINY_DISTILL.format(root=sample_data('imagenet', tier))
    cfg = learning_config(tmp_path / 'cfg.py', CONFIG, body)
    work = str(tmp_path / 'work')
    proc = run_tool(['tools/train.py', cfg, '--work-dir', work, *SMALL_CROPS])
    log = proc.stdout + proc.stderr
    # 8 images, batch 4: two iterations, each logging the three loss terms
    assert 'Epoch(train) [1][2/2]' in log, log[-3000:]
    for key in ('loss_global_cos', 'loss_patch_cos', 'loss_patch_mse'):
        assert key in log, log[-3000:]
    lrs_1 = [float(v) for v in re.findall(r'Epoch\(train\) +\[1\]\[\d/2\] +lr: (\S+)', log)]
    ckpt_1 = osp.join(work, 'epoch_1.pth')
    state = torch.load(ckpt_1, map_location='cpu', weights_only=False)
    assert state['meta']['iter'] == 2 and state['meta']['epoch'] == 1
    keys = list(state['state_dict'])
    # the student (with its projection) is saved, the frozen teacher is not
    assert any(k.startswith('student.output_proj.') for k in keys)
    assert not any(k.startswith('teacher.') for k in keys), keys[:10]
    # the optimizer holds the student's parameters only
    n_opt = sum(len(g['params']) for g in state['optimizer']['param_groups'])
    assert n_opt == len([k for k in keys if not k.startswith('data_preprocessor.')])

    proc = run_tool(['tools/train.py', cfg, '--work-dir', work, '--resume', *SMALL_CROPS,
                     'train_cfg.max_epochs=2'])
    log = proc.stdout + proc.stderr
    assert 'resumed epoch: 1, iter: 2' in log, log[-3000:]
    assert 'Epoch(train) [2][2/2]' in log and 'Epoch(train) [1]' not in log, log[-3000:]
    # the student learns (measured: 13-14%): the last loss is below that of the same 4 batches at learning rate 0
    # (the resumed run's random streams go on as the uninterrupted run's)
    work0 = str(tmp_path / 'work_lr0')
    run_tool(['tools/train.py', learning_config(tmp_path / 'cfg0.py', CONFIG, body, lr0=True),
              '--work-dir', work0, *SMALL_CROPS, 'train_cfg.max_epochs=2'])
    assert_loss_falls(train_losses(work), train_losses(work0), drop=0.01)
    # the warm-up schedule goes on where it stopped (it would restart at its first lr)
    lrs_2 = [float(v) for v in re.findall(r'Epoch\(train\) +\[2\]\[\d/2\] +lr: (\S+)', log)]
    assert len(lrs_1) == len(lrs_2) == 2, (lrs_1, lrs_2)
    step = lrs_1[1] - lrs_1[0]
    assert step > 0 and lrs_2 == pytest.approx([lrs_1[1] + step, lrs_1[1] + 2 * step], rel=1e-3)
    state_2 = torch.load(osp.join(work, 'epoch_2.pth'), map_location='cpu', weights_only=False)
    assert state_2['meta']['iter'] == 4 and state_2['meta']['epoch'] == 2
    # training went on from the resumed weights, with the same keys
    assert list(state_2['state_dict']) == keys

    # the distilled student serves downstream: VECA loads it strictly under the 'student.' prefix
    from mmeffattn.registry import MODELS
    backbone = MODELS.build(dict(
        type='mmeffattn.VECA', arch=dict(embed_dims=32, depth=2, num_heads=2), out_type='global',
        init_cfg=dict(type='Pretrained', checkpoint=osp.join(work, 'epoch_2.pth'),
                      prefix='student.')))
    backbone.init_weights()
    assert torch.equal(backbone.norm1.weight, state_2['state_dict']['student.norm1.weight'])
