"""``--cfg-options compile=True`` through tools/train.py and tools/test.py (torch.compile with
inductor, mmengine's ``compile`` option), on generated shapes (and ../shared/data's samples where
present, with --run-slow).

Each family's own ImageNet config, with its mini arch and a 64x64 input: three compiled training
iterations whose loss falls below the same batches' in an eager run at learning rate 0, a
checkpoint, then the compiled test step reports the accuracy of the (eager) validation that ended
the training.

Inductor's C++ code generation for even the mini SEMA's forward and backward took 6.5 minutes on
this shared 2-core machine with an empty cache (seconds once cached), so the default suite runs SEMA
with ``compile.backend=aot_eager``: the same path through the tools, mmengine's Runner, dynamo and
AOTAutograd, without inductor's codegen. ``--run-slow`` runs every family with the literal
``compile=True`` (inductor), and one compiled Mask R-CNN training step.
"""
import json
import os.path as osp

import pytest

from e2e_helpers import (NO_EVAL, assert_loss_falls, learning_config, run_tool, train_losses,
                         write_config)
from mmeffattn.analysis.logs import load_log
from mmeffattn.datasets import DEFAULT_METAINFO

pytestmark = pytest.mark.e2e

# three iterations on the same 2 images, 64x64 crops, validated on 8; mmpretrain's Mixup/CutMix
# stays in the data preprocessor, which tools/train.py keeps eager under compile. A mini model's
# few parameters move its loss little at the recipes' rates: a larger step.
TINY_IN1K = '''
data_root = {root!r}
train_pipeline = [dict(type='LoadImageFromFile'), dict(type='RandomResizedCrop', scale=64),
                  dict(type='PackInputs')]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(64, 64)),
                 dict(type='PackInputs')]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=2, pipeline=train_pipeline))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=8, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=3, val_interval=3)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True, begin=0, end=3)]
default_hooks = dict(logger=dict(interval=1))
optim_wrapper = dict(optimizer=dict(lr=1e-2))
model = dict(backbone=dict(arch=dict(_delete_=True, **{arch}), drop_path_rate=0.0{extra}),
             head=dict(in_channels={channels}))
'''

# family -> (config, mini arch, extra backbone arguments, head input channels)
FAMILIES = {
    'sema': ('configs/sema/sema-t_8xb128_in1k.py',  # one block a stage: the quick default run
             dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]), '', 256),
    'mila': ('configs/mila/mila-t_8xb128_in1k.py',
             dict(embed_dims=32, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8]), '', 256),
    'weightformer': ('configs/weightformer/weightformer-t_8xb256_in1k.py',
                     dict(embed_dims=32, depth=5), '', 32),
    # nested core dropout on (the recipe's): the budget is drawn before each compiled step
    'veca': ('configs/veca/veca-s_8xb128_in1k.py', dict(embed_dims=64, depth=3, num_heads=2),
             ', num_cores=16', 64),
    'laplacianformer': ('configs/laplacianformer/laplacianformer-t_8xb128_in1k.py',
                        dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                             num_heads=[1, 2, 2, 2], mlp_ratios=[2, 2, 2, 2],
                             sr_ratios=[8, 4, 2, 1]), '', 64),
}

COMPILED = 'Model has been "compiled"'  # mmengine's log line once it compiled a step


def _our_graph_breaks(log: str) -> list:
    """The ``TORCH_LOGS=graph_breaks`` lines that place a break in mmeffattn's code."""
    return [line for line in log.splitlines()
            if 'Graph break in user code at' in line and '/mmeffattn/' in line]


def _train_and_test_compiled(tmp_path, root: str, family: str, compile_options: list) -> None:
    config, arch, extra, channels = FAMILIES[family]
    body = TINY_IN1K.format(root=root, arch=arch, extra=extra, channels=channels)
    cfg = learning_config(tmp_path / 'cfg.py', config, body)
    work = str(tmp_path / 'work')
    # graph breaks are logged: the eager data preprocessor makes some, our code must make none
    env = dict(OMP_NUM_THREADS='1', TORCH_LOGS='graph_breaks')
    proc = run_tool(['tools/train.py', cfg, '--work-dir', work, '--cfg-options', *compile_options],
                    env=env)
    log = proc.stdout + proc.stderr
    assert COMPILED in log and 'Epoch(train) [3][1/1]' in log, log[-3000:]
    assert not _our_graph_breaks(log), _our_graph_breaks(log)
    assert osp.isfile(osp.join(work, 'epoch_3.pth'))

    out_json = str(tmp_path / 'metrics.json')
    proc = run_tool(['tools/test.py', cfg, osp.join(work, 'epoch_3.pth'), '--work-dir', work,
                     '--out-json', out_json, '--cfg-options', *compile_options], env=env)
    assert COMPILED in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    # the compiled test step reaches the accuracy of the eager validation that ended the training
    metrics, validated = json.load(open(out_json))['metrics'], load_log(work)
    for key in ('accuracy/top1', 'accuracy/top5'):
        assert metrics[key] == validated.series(key, 'val')[1][-1], key

    # it learns: the same batches in an eager run at learning rate 0 (which starts from the
    # loss the compiled step computed) end higher
    work0 = str(tmp_path / 'work_lr0')
    run_tool(['tools/train.py', learning_config(tmp_path / 'cfg0.py', config, body, lr0=True),
              '--work-dir', work0, '--cfg-options', 'val_cfg=None', 'val_dataloader=None',
              'val_evaluator=None'], env=dict(OMP_NUM_THREADS='1'))
    assert_loss_falls(train_losses(work), train_losses(work0), drop=0.01)


TIERS = ['generated', pytest.param('real', marks=pytest.mark.slow)]


@pytest.mark.parametrize('tier', TIERS)
def test_compiled_train_and_test(tmp_path, tier, sample_data):
    _train_and_test_compiled(tmp_path, sample_data('imagenet', tier), 'sema',
                             ['compile.backend=aot_eager'])


@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_compiled_train_and_test_every_family(tmp_path, family, sample_data):
    _train_and_test_compiled(tmp_path, sample_data('imagenet', 'generated'), family,
                             ['compile=True'])


TINY_COCO = '''
data_root = {root!r}
metainfo = {metainfo!r}
small = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True,
         with_mask=True), dict(type='Resize', scale=(128, 96), keep_ratio=True),
         dict(type='PackDetInputs')]
train_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, indices=1, pipeline=small))
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, depths=[1, 2, 1, 1],
                                     num_heads=[1, 2, 4, 8]), drop_path_rate=0.0),
             neck=dict(in_channels=[32, 64, 128, 256]))
train_cfg = dict(max_epochs=1, val_interval=10)
default_hooks = dict(logger=dict(interval=1))
''' + NO_EVAL


@pytest.mark.slow
@pytest.mark.parametrize('tier', ['generated', 'real'])
def test_compiled_train_step_of_a_detector(tmp_path, tier, sample_data):
    """Mask R-CNN + SEMA (mini arch): one compiled training iteration (mmdet pads each batch to its
    own size in the data preprocessor, which stays eager)."""
    metainfo = dict(DEFAULT_METAINFO) if tier == 'generated' else None  # None: COCO's classes
    cfg = write_config(tmp_path / 'cfg.py', 'configs/sema/mask-rcnn_sema-t_fpn_1x_coco.py',
                       TINY_COCO.format(root=sample_data('coco', tier), metainfo=metainfo))
    work = str(tmp_path / 'work')
    proc = run_tool(['tools/train.py', cfg, '--work-dir', work, '--cfg-options', 'compile=True'],
                    env=dict(OMP_NUM_THREADS='1', TORCH_LOGS='graph_breaks'),
                    timeout=1800)  # inductor, empty cache: over 10 minutes on a loaded CPU
    log = proc.stdout + proc.stderr
    assert COMPILED in log and 'Epoch(train) [1][1/1]' in log, log[-3000:]
    assert not _our_graph_breaks(log), _our_graph_breaks(log)
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
