"""``tools/test.py --tta``: the config transformation (fast, no data) and end-to-end runs with
mmseg's multi-scale + flip (UperNet, ADE20K layout) and mmdet's TTA (RetinaNet, COCO layout), on
generated shapes (and ../shared/data's samples with --run-slow); the metrics they report are
recomputed from the predictions they wrote."""
import glob
import importlib.util
import json
import os
import os.path as osp
from typing import Tuple

import numpy as np
import pytest
import torch
from mmengine.config import Config

from e2e_helpers import ROOT, pycocotools_map, run_tool, write_config
from mmeffattn.datasets import DEFAULT_METAINFO

ADE_UPERNET = 'configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py'
RETINANET = 'configs/sema/retinanet_sema-t_fpn_1x_coco.py'
# A narrow SEMA (16/32/64/128 channels, one block per stage) so that inference takes a second.
NARROW_SEMA = "dict(_delete_=True, embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])"


def _tool():
    """tools/test.py as a module (``test`` alone would be the standard library's package)."""
    spec = importlib.util.spec_from_file_location('_tool_test_tta', osp.join(ROOT, 'tools',
                                                                              'test.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tta_step(pipeline) -> dict:
    (step, ) = [t for t in pipeline if t['type'] == 'TestTimeAug']
    return step


# ------------------------------------------------------------------ the config transformation
@pytest.mark.parametrize('config', [
    ADE_UPERNET, 'configs/veca/veca-s_upernet_8xb2-160k_ade20k-512x512.py',
    'configs/weightformer/weightformer-t_upernet_8xb2-160k_ade20k-512x512.py',
    'configs/laplacianformer/laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py',
    'configs/mila/mila-t_upernet_8xb2-160k_ade20k-512x512.py'],
    ids=['sema', 'veca', 'weightformer', 'laplacianformer', 'mila'])
def test_ade20k_upernet_tta_is_mmseg_multiscale_flip(config):
    """The model is wrapped in SegTTAModel and the test pipeline is mmseg's 0.5-1.75 x flip."""
    cfg = Config.fromfile(osp.join(ROOT, config))
    model, pipeline = cfg.model.copy(), cfg.tta_pipeline
    assert cfg.test_dataloader.dataset.pipeline != pipeline
    _tool().apply_tta(cfg, config)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module == model
    assert cfg.test_dataloader.dataset.pipeline == pipeline
    resizes, flips = _tta_step(pipeline)['transforms'][:2]
    assert [r['scale_factor'] for r in resizes] == [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert sorted(f['prob'] for f in flips) == [0.0, 1.0]


RETINANETS = sorted(glob.glob(osp.join(ROOT, 'configs', '*', 'retinanet_*.py')))


@pytest.mark.parametrize('config', RETINANETS, ids=[osp.basename(p) for p in RETINANETS])
def test_retinanet_tta_is_mmdets_own(config):
    """Every family's RetinaNet inherits mmdet's retinanet_tta.py: DetTTAModel with NMS merging,
    three scales x flip, with the boxes loaded for evaluation."""
    cfg = Config.fromfile(config)
    _tool().apply_tta(cfg, config)
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module.type == 'RetinaNet'
    assert cfg.model.module.backbone.type.startswith('mmeffattn.')
    assert cfg.model.tta_cfg.nms.type == 'nms'
    scales, flips, loads = _tta_step(cfg.test_dataloader.dataset.pipeline)['transforms'][:3]
    assert len(scales) == 3 and sorted(f['prob'] for f in flips) == [0.0, 1.0]
    assert loads[0]['with_bbox']


def test_tta_pipeline_replaces_the_innermost_dataset_pipeline():
    cfg = Config(dict(default_scope='mmseg', model=dict(type='M'), tta_model=dict(type='T'),
                      tta_pipeline=[dict(type='TestTimeAug', transforms=[])],
                      test_dataloader=dict(dataset=dict(
                          type='RepeatDataset', times=2,
                          dataset=dict(type='D', pipeline=[dict(type='Old')])))))
    _tool().apply_tta(cfg)
    assert cfg.test_dataloader.dataset.dataset.pipeline == [dict(type='TestTimeAug',
                                                                 transforms=[])]
    assert 'pipeline' not in cfg.test_dataloader.dataset
    assert cfg.model == dict(type='T', module=dict(type='M'))


@pytest.mark.parametrize('config, words', [
    ('configs/sema/sema-t_8xb128_in1k.py', ['tta_model and tta_pipeline', 'AverageClsScoreTTA']),
    ('configs/sema/mask-rcnn_sema-t_fpn_1x_coco.py', ['mask head', 'DetTTAModel', 'retinanet']),
], ids=['classifier-without-tta', 'mask-rcnn'])
def test_tta_refusals_name_the_fix(config, words, tmp_path):
    """Through the command line, before any checkpoint or data is read (the checkpoint does not
    exist): a config without TTA names what to add; Mask R-CNN names why mmdet's TTA cannot."""
    with pytest.raises(ValueError) as err:
        _tool().main([osp.join(ROOT, config), str(tmp_path / 'absent.pth'), '--tta',
                      '--work-dir', str(tmp_path)])
    for word in words:
        assert word in str(err.value), str(err.value)


def test_missing_tta_pipeline_is_named():
    cfg = Config(dict(default_scope='mmdet', model=dict(type='RetinaNet'),
                      tta_model=dict(type='DetTTAModel'), test_dataloader=dict(dataset=dict())))
    with pytest.raises(ValueError, match=r"needs tta_pipeline .*mmdet::retinanet/retinanet_tta"):
        _tool().apply_tta(cfg, 'x.py')


# ------------------------------------------------------------------ end to end
def _random_checkpoint(cfg_path: str, registry, path) -> str:
    """A randomly initialised model of the config, saved as mmengine saves one."""
    torch.manual_seed(0)
    model = registry.build(Config.fromfile(cfg_path).model)
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return str(path)


def _test_with_tta(tmp_path, scope: str, base: str, body: str,
                   options: list) -> Tuple[dict, Config, str]:
    """Run ``tools/test.py --tta`` (with ``--cfg-options options``) on a random checkpoint of the
    config ``base`` + ``body``, whose models live in ``scope`` ('mmdet' or 'mmseg').

    Returns the metrics it wrote, the config its Runner really ran (dumped) and the log."""
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    cfg = write_config(tmp_path / 'cfg.py', base, body)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    ckpt = _random_checkpoint(cfg, registry, tmp_path / 'random.pth')
    out_json, work = str(tmp_path / 'metrics.json'), str(tmp_path / 'work')
    proc = run_tool(['tools/test.py', cfg, ckpt, '--tta', '--work-dir', work, '--out-json',
                     out_json, '--cfg-options', *options])
    record = json.load(open(out_json))
    assert record['tta'] is True
    return record['metrics'], Config.fromfile(_dumped_config(work)), proc.stdout + proc.stderr


def _miou(pred_dir: str, label_dir: str, num_classes: int = 150) -> float:
    """mIoU (%) of the label maps mmseg's IoUMetric wrote to ``pred_dir`` (ADE20K's 1..150)
    against those in ``label_dir`` (0: other, ignored), over all images: the classes that are
    in neither get no IoU."""
    from PIL import Image
    inter, union = np.zeros(num_classes), np.zeros(num_classes)
    for name in sorted(os.listdir(pred_dir)):
        pred = np.asarray(Image.open(osp.join(pred_dir, name)), np.int64) - 1
        label = np.asarray(Image.open(osp.join(label_dir, name)), np.int64) - 1
        valid = label >= 0
        pred, label = pred[valid], label[valid]
        inter += np.bincount(label[pred == label], minlength=num_classes)
        union += (np.bincount(pred, minlength=num_classes)
                  + np.bincount(label, minlength=num_classes)
                  - np.bincount(label[pred == label], minlength=num_classes))
    with np.errstate(invalid='ignore'):
        return float(np.nanmean(inter / union) * 100)


SMALL_ADE_TTA = '''
data_root = {root!r}
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(arch=''' + NARROW_SEMA + ''', drop_path_rate=0.0),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=16),
    auxiliary_head=dict(in_channels=64, channels=16))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
# mmseg's multi-scale + flip, at two small ratios of the original image instead of six
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in {ratios!r}],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations')], [dict(type='PackSegInputs')]]),
]
paths = dict(img_path='images/validation', seg_map_path='annotations/validation')
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, data_prefix=paths, pipeline=test_pipeline, indices=2))
'''
#: per data tier, the image ratios of the multi-scale test (the real images are ~512 px, the
#: generated ones 128x160)
ADE_RATIOS = {'real': (0.25, 0.375), 'generated': (0.75, 1.0)}
TIERS = ['generated', pytest.param('real', marks=pytest.mark.slow)]


@pytest.mark.e2e
@pytest.mark.parametrize('tier', TIERS)
def test_upernet_tta(tmp_path, tier, sample_data):
    root, ratios, preds = sample_data('ade20k', tier), ADE_RATIOS[tier], str(tmp_path / 'preds')
    metrics, dumped, log = _test_with_tta(tmp_path, 'mmseg', ADE_UPERNET,
                                          SMALL_ADE_TTA.format(root=root, ratios=ratios),
                                          [f'test_evaluator.output_dir={preds}'])
    # the reported mIoU is that of the merged predictions the evaluator wrote (the log rounds
    # to 2 decimals)
    assert len(os.listdir(preds)) == 2
    assert metrics['mIoU'] == pytest.approx(_miou(preds, root + 'annotations/validation'),
                                            abs=0.01)
    assert dumped.model.type == 'SegTTAModel' and dumped.model.module.type == 'EncoderDecoder'
    resizes = _tta_step(dumped.test_dataloader.dataset.pipeline)['transforms'][0]
    assert [r['scale_factor'] for r in resizes] == list(ratios)
    assert 'Load checkpoint from' in log or 'Loads checkpoint' in log


SMALL_COCO_TTA = '''
data_root = {root!r}
metainfo = {metainfo!r}
model = dict(
    backbone=dict(arch=''' + NARROW_SEMA + ''', drop_path_rate=0.0),
    neck=dict(in_channels=[32, 64, 128], out_channels=32),
    bbox_head=dict(in_channels=32, feat_channels=32, stacked_convs=1, num_classes={num_classes}),
    test_cfg=dict(score_thr=0.0, max_per_img=20))
# mmdet's RetinaNet TTA (scales x flip, NMS merge) at two small scales instead of 800-1200 px
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=s, keep_ratio=True) for s in ((320, 224), (224, 160))],
        [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
        [dict(type='LoadAnnotations', with_bbox=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                               'scale_factor', 'flip', 'flip_direction'))]]),
]
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, indices=2))
test_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
'''


@pytest.mark.e2e
@pytest.mark.parametrize('tier', TIERS)
def test_retinanet_tta(tmp_path, tier, sample_data):
    root, dets = sample_data('coco', tier), str(tmp_path / 'dets')
    metainfo = dict(DEFAULT_METAINFO) if tier == 'generated' else None  # None: COCO's classes
    body = SMALL_COCO_TTA.format(root=root, metainfo=metainfo,
                                 num_classes=len(metainfo['classes']) if metainfo else 80)
    metrics, dumped, _ = _test_with_tta(tmp_path, 'mmdet', RETINANET, body,
                                        [f'test_evaluator.outfile_prefix={dets}'])
    # the reported mAP is that of the merged detections the evaluator wrote
    expected = pycocotools_map(root + 'annotations/instances_val2017.json', f'{dets}.bbox.json',
                               'bbox')
    assert metrics['coco/bbox_mAP'] == pytest.approx(expected, abs=5e-4)
    assert dumped.model.type == 'DetTTAModel' and dumped.model.module.type == 'RetinaNet'
    scales = _tta_step(dumped.test_dataloader.dataset.pipeline)['transforms'][0]
    assert [tuple(r['scale']) for r in scales] == [(320, 224), (224, 160)]


def _dumped_config(work: str) -> str:
    """The config this run's Runner dumped (tools/test.py moves it into WORK_DIR/<timestamp>/)."""
    (path, ) = glob.glob(osp.join(work, '*', 'test_cfg.py'))
    return path
