"""The OpenMMLab Inferencers on our configs: mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``
and mmpretrain's ``ImageClassificationInferencer``, each on one image of a generated dataset in the
task's layout (and of ../shared/data's samples with --run-slow).

The checkpoint is a **randomly initialized** model (seeded) saved in mmengine's checkpoint layout
(``state_dict`` + ``meta.dataset_meta``), which exercises the same loading path as a trained one;
the predictions are therefore checked for form (shapes, ranges, classes), not quality. To keep the
test fast, each config (one of ours, by path) gets a narrow SEMA and a small test-pipeline size
through config edits; the README's usage is the same calls on the unchanged configs.
"""
import os
import os.path as osp

import numpy as np
import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.usefixtures('one_thread')

# (the base config names its arch by a string, so the dict replaces it)
ARCH = dict(_delete_=True, embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
WIDTHS = [16, 32, 64, 128]

DET = '''
model = dict(backbone=dict(arch={arch}, drop_path_rate=0.),
             neck=dict(in_channels={widths}, out_channels=32),
             rpn_head=dict(in_channels=32, feat_channels=32),
             roi_head=dict(bbox_roi_extractor=dict(out_channels=32),
                           bbox_head=dict(in_channels=32, fc_out_channels=64),
                           mask_roi_extractor=dict(out_channels=32),
                           mask_head=dict(in_channels=32, conv_out_channels=32)))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 128), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
'''

SEG = '''
model = dict(backbone=dict(arch={arch}, drop_path_rate=0.),
             decode_head=dict(in_channels={widths}, channels=32),
             auxiliary_head=dict(in_channels={widths[2]}, channels=16))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 128), keep_ratio=True),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
'''

CLS = '''
model = dict(backbone=dict(arch={arch}, drop_path_rate=0.), head=dict(in_channels={widths[3]}))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=72, edge='short'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
'''

CASES = {
    # scope, our config, edits, dataset layout, image folder
    'mmdet': ('configs/sema/mask-rcnn_sema-t_fpn_1x_coco.py', DET, 'coco', 'val2017'),
    'mmseg': ('configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py', SEG, 'ade20k',
              'images/validation'),
    'mmpretrain': ('configs/sema/sema-t_8xb128_in1k.py', CLS, 'imagenet', 'val'),
}
#: the image's source: the real samples add nothing to a random model's predictions
TIERS = ['generated', pytest.param('real', marks=pytest.mark.slow)]


def small_config_and_checkpoint(tmp_path, scope: str):
    """(config path, checkpoint path, classes): our config with the edits above, and a seeded
    random model saved as an mmengine checkpoint."""
    from mmengine.config import Config
    import importlib

    from mmengine.registry import DefaultScope, init_default_scope

    base, edits, _, _ = CASES[scope]
    cfg_path = tmp_path / f'{scope}_small.py'
    cfg_path.write_text(f'_base_ = {osp.join(ROOT, base)!r}\n' +
                        edits.format(arch=ARCH, widths=WIDTHS))
    cfg = Config.fromfile(str(cfg_path))
    init_default_scope(scope)
    import mmeffattn  # noqa: F401  (custom_imports)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model_cfg = cfg.model.copy()
    if scope == 'mmpretrain':  # mmpretrain configs keep it at the top level
        model_cfg.setdefault('data_preprocessor', cfg.get('data_preprocessor'))
    torch.manual_seed(0)
    model = registry.build(model_cfg)
    # (construction initializes every module; init_weights would only add logging)
    classes = getattr(importlib.import_module(f'{scope}.datasets'),
                      {'mmdet': 'CocoDataset', 'mmseg': 'ADE20KDataset',
                       'mmpretrain': 'ImageNet'}[scope])
    meta = dict(classes=classes.METAINFO['classes'])
    if 'palette' in classes.METAINFO:
        meta['palette'] = classes.METAINFO['palette']
    ckpt = str(tmp_path / f'{scope}_random.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': meta}}, ckpt)
    DefaultScope._instance_dict.clear()  # the inferencer sets its own scope
    return str(cfg_path), ckpt, meta['classes']


def one_image(sample_data, scope: str, tier: str) -> str:
    _, _, layout, folder = CASES[scope]
    folder = osp.join(sample_data(layout, tier), folder)
    return osp.join(folder, sorted(os.listdir(folder))[0])


@pytest.mark.parametrize('tier', TIERS)
def test_det_inferencer(tmp_path, sample_data, tier):
    from mmdet.apis import DetInferencer
    img = one_image(sample_data, 'mmdet', tier)
    cfg, ckpt, classes = small_config_and_checkpoint(tmp_path, 'mmdet')
    inferencer = DetInferencer(model=cfg, weights=ckpt, device='cpu')
    assert inferencer.model.dataset_meta['classes'] == classes
    result = inferencer(img, out_dir=str(tmp_path / 'det'))
    pred = result['predictions'][0]
    assert set(pred) >= {'labels', 'scores', 'bboxes', 'masks'}
    assert len(pred['labels']) == len(pred['scores']) == len(pred['bboxes'])
    assert all(0 <= s <= 1 for s in pred['scores'])
    assert all(0 <= label < len(classes) for label in pred['labels'])
    assert os.listdir(tmp_path / 'det' / 'vis'), 'no visualization written'


@pytest.mark.parametrize('tier', TIERS)
def test_mmseg_inferencer(tmp_path, sample_data, tier):
    from mmseg.apis import MMSegInferencer
    from PIL import Image
    img = one_image(sample_data, 'mmseg', tier)
    cfg, ckpt, classes = small_config_and_checkpoint(tmp_path, 'mmseg')
    inferencer = MMSegInferencer(model=cfg, weights=ckpt, device='cpu')
    result = inferencer(img)
    pred = np.asarray(result['predictions'])
    with Image.open(img) as opened:
        w, h = opened.size
    assert pred.shape == (h, w)  # at the original image size
    assert pred.min() >= 0 and pred.max() < len(classes)


@pytest.mark.parametrize('tier', TIERS)
def test_image_classification_inferencer(tmp_path, sample_data, tier):
    from mmpretrain.apis import ImageClassificationInferencer
    img = one_image(sample_data, 'mmpretrain', tier)
    cfg, ckpt, classes = small_config_and_checkpoint(tmp_path, 'mmpretrain')
    inferencer = ImageClassificationInferencer(model=cfg, pretrained=ckpt, device='cpu')
    result = inferencer(img)[0]
    scores = np.asarray(result['pred_scores'])
    assert scores.shape == (len(classes), )
    assert abs(scores.sum() - 1) < 1e-4
    assert result['pred_label'] == int(scores.argmax())
    assert result['pred_class'] == classes[result['pred_label']]
