"""tools/analysis_tools/resolution_sweep.py: the size overrides for each family's test pipeline,
and a run end to end on ../shared/data/imagenet_sample with a randomly initialized checkpoint."""
import json
import os.path as osp

import pytest
from mmengine.config import Config

from e2e_helpers import run_tool, write_config
from tools.analysis_tools.resolution_sweep import markdown_table, size_overrides

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

KEY = 'test_dataloader.dataset.pipeline'


def _pipeline(config: str):
    return Config.fromfile(osp.join(ROOT, config)).test_dataloader.dataset.pipeline


def test_classifier_keeps_the_resize_crop_ratio():
    # mmpretrain: ResizeEdge 256 + CenterCrop 224 (index 1 and 2)
    o = size_overrides(_pipeline('configs/sema/sema-t_8xb128_in1k.py'), 448)
    assert o == {f'{KEY}.1.scale': 512, f'{KEY}.2.crop_size': 448}
    # WeightFormer: square Resize (256, 256) + CenterCrop 224, as the official transform
    o = size_overrides(_pipeline('configs/weightformer/weightformer-t_8xb256_in1k.py'), 1024)
    assert o == {f'{KEY}.1.scale': [1170, 1170], f'{KEY}.2.crop_size': 1024}


def test_segmentation_and_detection_set_the_short_side():
    # mmseg ADE20K: Resize (2048, 512) keep_ratio -> (4S, S)
    o = size_overrides(_pipeline('configs/veca/veca-s_upernet_8xb2-160k_ade20k-512x512.py'),
                       1024)
    assert o == {f'{KEY}.1.scale': [4096, 1024]}
    # mmdet COCO: Resize (1333, 800) keep_ratio -> unchanged at 800, scaled otherwise
    det = _pipeline('configs/sema/mask-rcnn_sema-t_fpn_1x_coco.py')
    i = next(j for j, t in enumerate(det) if t['type'] == 'Resize')
    assert size_overrides(det, 800) == {f'{KEY}.{i}.scale': [1333, 800]}
    assert size_overrides(det, 400) == {f'{KEY}.{i}.scale': [666, 400]}  # round(666.5) -> even


def test_unsupported_pipelines_are_rejected():
    with pytest.raises(ValueError, match='TestTimeAug'):
        size_overrides([dict(type='LoadImageFromFile'), dict(type='TestTimeAug')], 224)
    with pytest.raises(ValueError, match='add a Resize'):
        size_overrides([dict(type='LoadImageFromFile'), dict(type='PackInputs')], 224)


def test_markdown_table_has_one_row_per_size():
    md = markdown_table([dict(size=64, metrics={'accuracy/top1': 1.0}),
                         dict(size=96, metrics={'accuracy/top1': 2.5, 'x': 3})])
    lines = md.strip().split('\n')
    assert lines[0] == '| size | accuracy/top1 | x |'
    assert lines[2] == '| 64 | 1.00 | - |' and lines[3] == '| 96 | 2.50 | 3 |'


SMALL_TEST = '''
data_root = {root!r}
test_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=8))
'''


@pytest.mark.e2e
@pytest.mark.parametrize('tier', ['generated', pytest.param('real', marks=pytest.mark.slow)])
def test_sweep_end_to_end(tmp_path, sample_data, tier):
    root = sample_data('imagenet', tier)
    cfg = write_config(tmp_path / 'cfg.py', 'configs/sema/sema-t_8xb128_in1k.py',
                       SMALL_TEST.format(root=root))
    # a randomly initialized SEMA-T classifier saved as a checkpoint (no training needed here)
    import torch
    from mmengine.registry import MODELS, DefaultScope

    import mmeffattn  # noqa: F401
    config = Config.fromfile(cfg)
    with DefaultScope.overwrite_default_scope(config.default_scope):
        model = MODELS.build(config.model)
    ckpt = str(tmp_path / 'random_init.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    out, work = str(tmp_path / 'sweep'), tmp_path / 'work'
    run_tool(['tools/analysis_tools/resolution_sweep.py', cfg, ckpt, '--sizes', '64', '96',
              '--work-dir', str(work), '--out', out])
    record = json.load(open(out + '.json'))
    assert [r['size'] for r in record['results']] == [64, 96]
    for r in record['results']:
        assert 0.0 <= r['metrics']['accuracy/top1'] <= 100.0
    assert record['results'][1]['overrides'][f'{KEY}.2.crop_size'] == 96
    md = open(out + '.md').read()
    assert '| 64 |' in md and '| 96 |' in md, md
    # each run really used its size: the config dump in test.py's log holds the overrides
    for size in (64, 96):
        logs = list((work / f'size_{size}').rglob('*.log'))
        assert logs and any(f'crop_size={size}' in p.read_text() for p in logs), logs


FAMILY_CONFIGS = [  # one test pipeline per family and downstream library
    'configs/mila/mila-t_8xb128_in1k.py',
    'configs/veca/veca-s_8xb128_in1k.py',
    'configs/laplacianformer/laplacianformer-t_8xb128_in1k.py',
    'configs/laplacianformer/laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py',
    'configs/weightformer/retinanet_weightformer-t_fpn_1x_coco.py',
    'configs/veca/veca-s_upernet_8xb2-80k_pascal-context-59-480x480.py',
]


@pytest.mark.parametrize('config', FAMILY_CONFIGS, ids=[osp.basename(c) for c in FAMILY_CONFIGS])
def test_every_family_gets_size_overrides(config):
    pipeline = _pipeline(config)
    o = size_overrides(pipeline, 1024)
    assert o and all(k.startswith(KEY) for k in o)
    sizes = [min(v) if isinstance(v, list) else v for v in o.values()]
    assert min(sizes) == 1024  # the crop or the short side is the requested size
