"""The configs of the papers' experiments (resolution, WeightFormer-B 448, VECA PASCAL Context)
build, hold the settings they claim, and run a forward pass on a small odd-sized input."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

import mmeffattn  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.usefixtures('one_thread')

SEMA_TEST = {448: 512, 672: 768, 1024: 1170}  # crop -> short-side resize (ratio 256 / 224)
# tests/configs/test_configs.py builds every config under configs/ (these included); a forward
# pass here for one config per new model (the SEMA evaluation configs hold the 224 model, as
# test_sema_resolution_eval_configs checks; VECA-B is VECA-S's recipe with a wider trunk)
FORWARD_CONFIGS = [
    'configs/sema/sema-t_8xb16-30e_in1k-1024px.py',
    'configs/weightformer/weightformer-b_8xb256_in1k-448px.py',
    'configs/veca/veca-s_upernet_8xb2-80k_pascal-context-59-480x480.py',
]


def _load(path: str) -> Config:
    return Config.fromfile(osp.join(ROOT, path))


def _types(pipeline):
    return {t['type']: t for t in pipeline}


@pytest.mark.parametrize('size', list(SEMA_TEST))
def test_sema_resolution_eval_configs(size):
    cfg = _load(f'configs/sema/sema-t_in1k-test-{size}px.py')
    base = _load('configs/sema/sema-t_8xb128_in1k.py')
    t = _types(cfg.test_dataloader.dataset.pipeline)
    assert t['CenterCrop']['crop_size'] == size
    assert t['ResizeEdge']['scale'] == SEMA_TEST[size]
    # evaluation only: the 224 model, unchanged (the checkpoint is given to tools/test.py)
    assert cfg.model.backbone == base.model.backbone
    assert _types(cfg.train_dataloader.dataset.pipeline)['RandomResizedCrop']['scale'] == 224


def test_sema_1024_finetune_config():
    cfg = _load('configs/sema/sema-t_8xb16-30e_in1k-1024px.py')
    assert _types(cfg.train_dataloader.dataset.pipeline)['RandomResizedCrop']['scale'] == 1024
    # Swin's 384 fine-tuning at batch 1024 (its lrs are per 512 images); tested without a crop
    test = _types(cfg.test_dataloader.dataset.pipeline)
    assert test['Resize']['scale'] == (1024, 1024) and 'CenterCrop' not in test
    assert cfg.train_cfg.max_epochs == 30 and 'load_from' in cfg
    assert cfg.optim_wrapper.optimizer.lr == 4e-5 and cfg.auto_scale_lr.base_batch_size == 1024
    warmup, cosine = cfg.param_scheduler
    assert warmup.start_factor == 1e-3 and warmup.end == 5 and cosine.eta_min == 4e-7


@pytest.mark.parametrize('family', ['sema', 'mila'])
def test_mask_rcnn_configs_are_mllas_recipe(family):
    """MLLA's 1x and 3x Mask R-CNN configs share the DETR-style multi-scale + crop pipeline and
    a 500-iteration warm-up; they differ in epochs, milestones and drop path."""
    for schedule, epochs, milestones, drop_path in (('1x', 12, [8, 11], 0.1),
                                                    ('ms-crop-3x', 36, [27, 33], 0.3)):
        cfg = _load(f'configs/{family}/mask-rcnn_{family}-t_fpn_{schedule}_coco.py')
        pipeline = _types(cfg.train_dataloader.dataset.pipeline)
        multi_scale, crop = pipeline['RandomChoice']['transforms']
        assert multi_scale[0]['scales'][0] == (480, 1333) and len(multi_scale[0]['scales']) == 11
        assert [t['type'] for t in crop] == ['RandomChoiceResize', 'RandomCrop',
                                             'RandomChoiceResize']
        assert crop[1]['crop_size'] == (384, 600)
        warmup, steps = cfg.param_scheduler
        assert (warmup.type, warmup.end, warmup.start_factor) == ('LinearLR', 500, 0.001)
        assert steps.milestones == milestones and cfg.train_cfg.max_epochs == epochs
        assert cfg.model.backbone.drop_path_rate == drop_path
        assert cfg.optim_wrapper.optimizer.lr == 1e-4


def test_weightformer_recipe_is_the_official_batch_and_lr():
    """cfg/wfm_{t,s,b}.yaml: BATCH_SIZE 256 on 8 GPUs; main.py scales the lrs per 512 images."""
    for arch in ('t', 's'):
        cfg = _load(f'configs/weightformer/weightformer-{arch}_8xb256_in1k.py')
        assert cfg.train_dataloader.batch_size == 256 and cfg.auto_scale_lr.base_batch_size == 2048
        assert cfg.optim_wrapper.optimizer.lr == 5e-4 * 2048 / 512
        assert cfg.param_scheduler[-1].eta_min == 5e-6 * 2048 / 512


def test_weightformer_b_is_the_official_wfm_base_at_448():
    cfg = _load('configs/weightformer/weightformer-b_8xb256_in1k-448px.py')
    from mmeffattn.models.backbones.weightformer import WeightFormer
    # official model/wfm.py wfm_base: patch 16, embed_dim 384, depth 17; cfg/wfm_b.yaml: 448,
    # drop path 0.2
    assert WeightFormer.arch_zoo['base'] == dict(embed_dims=384, depth=17, mlp_ratio=4.)
    assert cfg.model.backbone.arch == 'base' and cfg.model.backbone.drop_path_rate == 0.2
    assert _types(cfg.train_dataloader.dataset.pipeline)['RandomResizedCrop']['scale'] == 448
    t = _types(cfg.test_dataloader.dataset.pipeline)
    assert t['Resize']['scale'] == (512, 512) and t['CenterCrop']['crop_size'] == 448


@pytest.mark.parametrize('arch', ['s', 'b'])
def test_veca_pascal_context_configs(arch):
    cfg = _load(f'configs/veca/veca-{arch}_upernet_8xb2-80k_pascal-context-59-480x480.py')
    assert cfg.train_dataloader.dataset.type == 'PascalContextDataset59'
    assert cfg.test_dataloader.dataset.type == 'PascalContextDataset59'
    assert cfg.model.decode_head.num_classes == 59 and cfg.model.auxiliary_head.num_classes == 59
    assert cfg.train_cfg.max_iters == 80000
    assert cfg.param_scheduler[-1].end == 80000
    assert cfg.model.data_preprocessor.size == (480, 480)


@pytest.mark.parametrize('path', FORWARD_CONFIGS,
                         ids=[osp.basename(p) for p in FORWARD_CONFIGS])
def test_new_config_builds_and_runs(path, monkeypatch):
    # the PyTorch references: under the test harness's Triton interpreter a forward takes minutes
    monkeypatch.setenv('MMEFFATTN_OPS_BACKEND', 'reference')
    cfg = _load(path)
    from mmengine.registry import MODELS
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model).eval()
        assert type(model.backbone).__module__.startswith('mmeffattn.')
        with torch.no_grad():
            out = model(torch.randn(1, 3, 67, 93), mode='tensor')
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert torch.isfinite(out).all()
    if 'decode_head' in cfg.model:
        assert out.shape[1] == 59
    else:
        assert out.shape == (1, 1000)
