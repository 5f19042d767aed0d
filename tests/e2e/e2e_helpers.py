"""Run the project's tools as a user would: in a subprocess, from the project root."""
import os
import os.path as osp
import re
import subprocess
import sys
from typing import List, Tuple

import pytest

from mmeffattn.datasets import DEFAULT_METAINFO

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_CRASH_LINE = re.compile(r'terminate called|what\(\)|Error:|Aborted|Segmentation fault')


def run_tool(args: List[str], timeout: int = 600, expect_ok: bool = True,
             env: dict = None) -> subprocess.CompletedProcess:
    """Run ``args`` (e.g. ['tools/train.py', cfg, ...]) with this interpreter from ROOT."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable, **(env or {}))
    full_env.pop('TRITON_INTERPRET', None)  # models use the reference path on CPU
    cmd = args if args[0] in ('bash', 'sh') else [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    if expect_ok and proc.returncode != 0:
        # the cause of a crash (a C++ abort, a child's traceback) can be far from the tail
        # that a launcher's own report fills, so its lines are quoted first
        causes = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if _CRASH_LINE.search(line)][:30]
        raise AssertionError(f'{" ".join(cmd)} failed ({proc.returncode}):\n'
                             + ''.join(f'  cause? {line}\n' for line in causes)
                             + f'{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}')
    return proc


def stock_train_py(package: str) -> str:
    """The installed ``package``'s own ``tools/train.py`` (shipped under ``.mim/tools``); skips
    when the package or the file is missing."""
    module = pytest.importorskip(package)
    path = osp.join(osp.dirname(module.__file__), '.mim', 'tools', 'train.py')
    if not osp.isfile(path):
        pytest.skip(f'the installed {package} ships no {path}')
    return path


def write_config(path, base: str, body: str) -> str:
    """A user config that inherits one of ours by absolute path and overrides ``body``."""
    text = f'_base_ = {osp.join(ROOT, base)!r}\n' + body
    with open(path, 'w') as f:
        f.write(text)
    return str(path)


#: Config lines for a training-only run (no validation or test loop), appended to a config body.
NO_EVAL = '''
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
'''


#: ``MMEFFATTN_E2E_LR0=1`` trains the runs that must learn with learning rate 0, to check by hand
#: that their assertions then fail: a test that a model which never learns passes checks nothing.
FORCE_LR0 = os.environ.get('MMEFFATTN_E2E_LR0') == '1'

#: Config lines for a run that must show learning within a few iterations: a fixed seed, so that
#: its learning-rate-0 baseline starts from the same weights and sees the same batches. Each test
#: also logs every iteration and sets a constant learning rate: a recipe's warm-up holds it near
#: 0 for hundreds of iterations.
LEARN = '''
randomness = dict(seed=0)
'''
LR0 = '''
optim_wrapper = dict(optimizer=dict(lr=0.0))
'''


def learning_config(path, base: str, body: str, lr0: bool = False) -> str:
    """``write_config`` for a run that must learn (``lr0``: its baseline, the same run at
    learning rate 0; ``MMEFFATTN_E2E_LR0=1`` makes every such run one)."""
    return write_config(path, base, body + LEARN + (LR0 if lr0 or FORCE_LR0 else ''))


def train_losses(work_dir: str) -> List[float]:
    """The total training loss of every logged iteration in ``work_dir`` (all its runs)."""
    from mmeffattn.analysis.logs import load_log
    return load_log(work_dir).series('loss', 'train')[1]


def assert_loss_falls(losses: List[float], losses_lr0: List[float], drop: float) -> None:
    """The last logged loss is at least ``drop`` (a fraction) below that of the same run at
    learning rate 0 at the same iteration. Both runs share the seed, hence the batches and their
    augmentation (a new crop alone moved the loss by 5%), and start from the same loss."""
    assert losses[0] == pytest.approx(losses_lr0[0], rel=1e-2), 'not the same first step'
    assert losses[-1] < (1 - drop) * losses_lr0[-1], (
        f'the training loss did not fall {drop:.1%} below the same batches\' at learning rate 0: '
        f'{[round(v, 4) for v in losses]} vs {[round(v, 4) for v in losses_lr0]}')


def assert_beats_baseline(metric: str, trained: float, baseline: float) -> None:
    """The trained model's ``metric`` is above that of the same model trained at learning rate 0
    on the same data."""
    assert trained > baseline, (
        f'{metric} {trained} does not beat {baseline}, what the same model reaches at learning '
        f'rate 0 on the same data: it did not learn')


def mini_backbone(config: str, key: str = 'backbone') -> Tuple[dict, List[int]]:
    """Config overrides that make ``config``'s ``model[key]`` its family's mini architecture (the
    smallest that runs every code path of the family), and the channels of its outputs.

    The runs on generated data use it: they check the pipeline through the tools, which does not
    depend on the width, and tests/configs and tests/models build each family at full size."""
    import torch
    from mmengine.config import Config
    from mmeffattn.registry import MODELS
    backbone = Config.fromfile(osp.join(ROOT, config)).model[key].to_dict()
    family = MODELS.get(backbone['type'])
    over = dict(arch=dict(family.mini_arch), drop_path_rate=0.0)
    for name in ('out_indices', 'num_cores'):  # an isotropic family's pyramid of fewer blocks
        if name in family.mini_kwargs and (name != 'out_indices'
                                           or backbone.get('out_type') == 'pyramid'):
            over[name] = family.mini_kwargs[name]
    model = MODELS.build({**backbone, **over, 'init_cfg': None}).eval()
    with torch.no_grad():
        outs = model(torch.zeros(1, 3, 64, 64))
    over['arch']['_delete_'] = True  # the config names its arch by a string, replaced whole
    return over, [out.shape[1] for out in outs]


def pycocotools_map(ann_file: str, results_json: str, iou_type: str) -> float:
    """COCO mAP of the detections in ``results_json`` (as mmdet's CocoMetric writes them with
    ``outfile_prefix``), computed by pycocotools alone."""
    import json
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    gt = COCO(ann_file)
    with open(results_json) as f:
        dets = json.load(f)
    coco_eval = COCOeval(gt, gt.loadRes(dets), iou_type)
    coco_eval.params.imgIds = sorted({d['image_id'] for d in dets})
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return float(coco_eval.stats[0])


#: a mini detector's loss hardly moves in a few updates at the recipes' 1e-4 (1e-2 diverges)
MINI_LR_DETECTOR = 'optim_wrapper = dict(optimizer=dict(lr=1e-3))\n'
#: COCO-layout runs per data tier: the classes (None: the config's, COCO's 80) and the image
#: scale (the generated shapes are drawn at 128x160)
COCO_TIERS = {
    'generated': dict(metainfo=dict(DEFAULT_METAINFO), scale=(160, 128)),
    'real': dict(metainfo=None, scale=(320, 224)),
}


def detector_model(config: str, tier: str) -> dict:
    """The model overrides of a detector's short runs.

    After a few iterations from scratch no score passes the usual 0.05 threshold, and CocoMetric
    reports nothing for an empty result: every detection is kept, so that AP is computed (it
    stays near 0 after a few updates, trained or not: that a detector learns is checked on its
    loss). Mask R-CNN on a CPU spends most of an iteration in its RoI heads (512 sampled RoIs per
    image through the 4-conv mask head): fewer, as in the demo. On generated data: the family's
    mini backbone, narrow heads and the 4 classes of shapes."""
    mask = 'mask' in config
    if mask:
        model = dict(train_cfg=dict(rpn_proposal=dict(nms_pre=300, max_per_img=100),
                                    rcnn=dict(sampler=dict(num=64))),
                     test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100),
                                   rcnn=dict(score_thr=0.0, max_per_img=20)))
    else:
        model = dict(test_cfg=dict(score_thr=0.0, max_per_img=20))
    if tier == 'generated':
        backbone, channels = mini_backbone(config)
        n, c = len(DEFAULT_METAINFO['classes']), 32
        model.update(backbone=backbone, neck=dict(in_channels=channels, out_channels=c))
        if mask:
            model.update(rpn_head=dict(in_channels=c, feat_channels=c), roi_head=dict(
                bbox_roi_extractor=dict(out_channels=c), mask_roi_extractor=dict(out_channels=c),
                bbox_head=dict(in_channels=c, fc_out_channels=2 * c, num_classes=n),
                mask_head=dict(in_channels=c, conv_out_channels=c, num_classes=n)))
        else:
            model.update(bbox_head=dict(in_channels=c, feat_channels=c, stacked_convs=1,
                                        num_classes=n))
    return model


#: ImageNet-layout runs on generated data: 64x64 pipelines (for a mini model), not the recipes' 224
SMALL_PIPELINES = dict(
    train=[dict(type='LoadImageFromFile'), dict(type='RandomResizedCrop', scale=64),
           dict(type='RandomFlip', prob=0.5), dict(type='PackInputs')],
    val=[dict(type='LoadImageFromFile'), dict(type='Resize', scale=(64, 64)),
         dict(type='PackInputs')])
#: a mini model's few parameters move its loss little at the recipe's rate: a larger step
MINI_LR = 'optim_wrapper = dict(optimizer=dict(lr=1e-2))\n'


def in1k_config(root: str, tier: str, config: str, images: int, batch: int, epochs: int) -> str:
    """The config body: the first ``images`` images of the split in batches of ``batch`` for
    ``epochs`` epochs at a constant learning rate, validated on the same images; on generated
    data, the family's mini backbone at 64x64."""
    loaders = {}
    for split in ('train', 'val'):
        dataset = dict(data_root=root, split='val', indices=images)
        if tier == 'generated':
            dataset['pipeline'] = SMALL_PIPELINES[split]
        loaders[split] = dict(batch_size=batch, num_workers=0, persistent_workers=False,
                              dataset=dataset)
    body = (f"train_dataloader = {loaders['train']!r}\n"
            f"val_dataloader = {loaders['val']!r}\n"
            'test_dataloader = val_dataloader\n'
            f'train_cfg = dict(max_epochs={epochs}, val_interval={epochs})\n'
            "param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True, begin=0, "
            f'end={epochs})]\n'
            'default_hooks = dict(logger=dict(interval=1))\n')
    if tier == 'generated':
        backbone, channels = mini_backbone(config)
        body += f'model = dict(backbone={backbone!r}, head=dict(in_channels={channels[-1]}))\n'
        body += MINI_LR
    return body
