"""The README's Python snippets run as written: the stock-config snippet is a config that
mmengine parses and whose model builds, the Inferencer snippet predicts on the image the
repository ships (with a checkpoint the test writes where the snippet reads it), and the ops
snippet runs on inputs the test defines. demo/demo.jpg is the generator's image it claims to be."""
import os
import os.path as osp
import re

import numpy as np
import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_IMAGE = osp.join(ROOT, 'demo', 'demo.jpg')

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')


def python_blocks(page: str = 'README.md'):
    text = open(osp.join(ROOT, page), encoding='utf-8').read()
    return re.findall(r'^```python\n(.*?)^```', text, flags=re.S | re.M)


def block_with(needle: str) -> str:
    found = [b for b in python_blocks() if needle in b]
    assert len(found) == 1, f'expected one README Python block with {needle!r}, got {len(found)}'
    return found[0]


def test_stock_config_snippet_parses_and_builds(tmp_path):
    """The snippet carries the opt-in that lets mmengine load its own checkpoints, and its model
    (SEMA-T in mmdet's Mask R-CNN) builds."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmdet.registry import MODELS
    snippet = block_with("_base_ = 'mmdet::")
    assert "'mmeffattn.engine.patch_mmengine'" in snippet
    path = tmp_path / 'stock.py'
    path.write_text(snippet)
    cfg = Config.fromfile(str(path))
    assert cfg.model.backbone.type == 'mmeffattn.SEMA'
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    assert type(model.backbone).__name__ == 'SEMA'


def _write_demo_checkpoint(config: str, path: str) -> None:
    """A checkpoint as the demo's training writes it: weights, dataset meta and the message hub
    (whose HistoryBuffer torch's weights-only loader refuses without the opt-in)."""
    from mmengine.config import Config
    from mmengine.logging import HistoryBuffer
    from mmengine.registry import DefaultScope

    from mmdet.registry import MODELS
    cfg = Config.fromfile(config)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    os.makedirs(osp.dirname(path), exist_ok=True)
    meta = dict(epoch=6, dataset_meta=dict(cfg.metainfo))
    torch.save(dict(meta=meta, state_dict=model.state_dict(),
                    message_hub=dict(log_scalars={'train/loss': HistoryBuffer([1.0], [1])})), path)


def test_inferencer_snippet_runs_on_the_shipped_image(tmp_path, monkeypatch):
    snippet = block_with('DetInferencer')
    image = re.search(r"inferencer\('([^']+)'", snippet).group(1)
    weights = re.search(r"weights='([^']+)'", snippet).group(1)
    model = re.search(r"model='([^']+)'", snippet).group(1)
    assert osp.isfile(osp.join(ROOT, image)), f'the README reads {image}, which is not shipped'
    # the snippet runs from the project root: give it one whose configs/ and demo/ are ours and
    # whose work_dirs/ holds the checkpoint the demo would have written
    os.symlink(osp.join(ROOT, 'configs'), tmp_path / 'configs')
    os.symlink(osp.join(ROOT, 'demo'), tmp_path / 'demo')
    _write_demo_checkpoint(osp.join(ROOT, model), str(tmp_path / weights))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(snippet, 'README.md', 'exec'), namespace)  # noqa: S102 - the README's own code
    result = namespace['inferencer'](image, out_dir='outputs/', return_vis=False)
    pred = result['predictions'][0]
    assert {'labels', 'scores', 'bboxes'} <= set(pred)
    drawn = list((tmp_path / 'outputs' / 'vis').glob('*.jpg'))
    assert [p.name for p in drawn] == ['demo.jpg']


def test_ops_snippet_runs():
    snippet = block_with('from mmeffattn.ops import')
    B, heads, H, W, D = 1, 2, 14, 14, 16
    q, k, v = (torch.randn(B, heads, H * W, D) for _ in range(3))
    namespace = dict(q=q, k=k, v=v, H=H, W=W)
    exec(compile(snippet, 'README.md', 'exec'), namespace)  # noqa: S102
    assert namespace['out'].shape == v.shape and torch.isfinite(namespace['out']).all()


def test_demo_image_is_the_generated_one(tmp_path):
    """demo/demo.jpg is validation image 1 of the shapes generator at seed 0 (256x256), saved as
    a JPEG: regenerate it and compare (JPEG's loss only)."""
    from PIL import Image

    from mmeffattn.datasets.synthetic_shapes import generate_shapes_coco
    generate_shapes_coco(str(tmp_path), num_train=1, num_val=2, img_size=(256, 256), seed=0)
    png = np.asarray(Image.open(tmp_path / 'val2017' / '000001.png').convert('RGB'), np.float32)
    jpg = np.asarray(Image.open(DEMO_IMAGE).convert('RGB'), np.float32)
    assert jpg.shape == png.shape == (256, 256, 3)
    assert np.abs(jpg - png).mean() < 6, 'demo/demo.jpg is not the generated image'
    assert osp.getsize(DEMO_IMAGE) < 64 * 1024
