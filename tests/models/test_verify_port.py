"""Verify a port in one command: ``tools/test.py CONFIG CHECKPOINT_OR_URL`` on the authors' files.

A local HTTP server (127.0.0.1) serves official-layout checkpoints at URLs shaped like the
authors' own: TsinghuaCloud's ``/f/<id>/?dl=1`` for MLLA, the Hugging Face hub's
``/<org>/<repo>/resolve/main/model.safetensors`` for WeightFormer, a Google Drive download for
VECA. tools/test.py evaluates the ImageNet configs of MILA-T and WeightFormer-T on a generated
ImageNet-style folder, by URL and by path, and the predictions it dumps (``--out``) must equal
the reference model's on the same preprocessed images:

- always, the official file is written from a seeded classifier of ours by the inverted key
  mapping (official_layouts.py), and the reference is that classifier;
- where ``MMEFFATTN_MLLA_ROOT`` / ``MMEFFATTN_WEIGHTFORMER_ROOT`` name a checkout of the official
  code (and timm imports), the official model itself gets seeded weights, is saved in its own
  layout, and the reference is its own forward (tools/analysis_tools/compare_official.py builds
  it). ``MMEFFATTN_VECA_ROOT`` adds VECA's refusal below for the official model's file.

The official VECA checkpoints are distilled backbones without a classifier: tools/test.py
refuses them for the VECA-S classifier with one line naming the head it lacks. A checkpoint
missing one parameter fails with one line too.
"""
import importlib.util
import io
import os
import os.path as osp
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SHARED_DATA
from official_layouts import server  # noqa: F401  (a fixture)
from official_layouts import classifier_to_official

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

CONFIGS = {'MLLA': 'configs/mila/mila-t_8xb128_in1k.py',
           'WeightFormer': 'configs/weightformer/weightformer-t_8xb256_in1k.py',
           'VECA': 'configs/veca/veca-s_8xb128_in1k.py'}
ROUTES = {'MLLA': '/f/7a19712877cb4242889c/?dl=1',
          'WeightFormer': '/RuizeHe/weightformer-t/resolve/main/model.safetensors',
          'VECA': '/uc?export=download&id=1VecaSmallStudent'}
ROOT_VARS = {'MLLA': 'MMEFFATTN_MLLA_ROOT', 'WeightFormer': 'MMEFFATTN_WEIGHTFORMER_ROOT',
             'VECA': 'MMEFFATTN_VECA_ROOT'}


@pytest.fixture(scope='module')
def generated_imagenet(tmp_path_factory) -> str:
    """Four 240x260 images of four classes in mmpretrain's ImageNet layout (``val/`` and
    ``meta/val.txt``)."""
    root = tmp_path_factory.mktemp('imagenet')
    (root / 'val').mkdir()
    (root / 'meta').mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for i in range(4):  # smooth colour fields with noise: not one flat class for every model
        yy, xx = np.mgrid[0:240, 0:260] / 60.
        img = np.stack([np.sin(xx * (i + 1)), np.cos(yy * (i + 2)), np.sin(xx + yy)], -1)
        img = ((img + 1) * 100 + rng.integers(0, 55, img.shape)).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(root / 'val' / f'img{i}.JPEG')
        lines.append(f'img{i}.JPEG {i * 250}')
    (root / 'meta' / 'val.txt').write_text('\n'.join(lines) + '\n')
    return str(root)


@pytest.fixture(autouse=True)
def fresh_logger():
    """What is logged outside a Runner goes to mmengine's current logger: a fresh one, on this
    test's output (an earlier test's Runner logged to a stream that pytest has closed)."""
    from mmengine.logging import MMLogger
    MMLogger.get_instance(f'verify_port_{len(MMLogger._instance_dict)}')


def user_config(tmp_path, layout: str, data_root: str, indices=None) -> str:
    path = tmp_path / 'cfg.py'
    path.write_text(f'_base_ = {osp.join(ROOT, CONFIGS[layout])!r}\n'
                    f'test_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,'
                    f' dataset=dict(data_root={data_root!r}, split="val", indices={indices!r}))\n')
    return str(path)


def build(cfg_path: str):
    """The config's classifier and its test set (the pipeline of tools/test.py's run)."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import DATASETS, MODELS
    cfg = Config.fromfile(cfg_path)
    model_cfg = dict(cfg.model, data_preprocessor=cfg.model.get('data_preprocessor')
                     or cfg.get('data_preprocessor'))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(model_cfg).eval(), DATASETS.build(cfg.test_dataloader.dataset)


def seeded_classifier(cfg_path: str):
    """The config's classifier with seeded weights, every parameter moved off its init (so that
    one left unloaded would show)."""
    torch.manual_seed(0)
    model, dataset = build(cfg_path)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model, dataset


def preprocessed(model, dataset):
    """``(image paths, the batch as the model gets it)``: the config's test pipeline and the
    model's data preprocessor."""
    from mmengine.dataset import pseudo_collate
    batch = model.data_preprocessor(pseudo_collate([dataset[i] for i in range(len(dataset))]))
    return [s.img_path for s in batch['data_samples']], batch


def file_bytes(obj, safetensors: bool) -> bytes:
    if safetensors:
        from safetensors.torch import save
        return save({k: v.contiguous() for k, v in obj['model'].items()})
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def run_test_tool(argv) -> int:
    """tools/test.py in this process, as run from a shell (``run_cli``): its exit code."""
    from tools import test as test_tool

    from mmeffattn.engine.runner_setup import run_cli
    try:
        run_cli(lambda: test_tool.main(argv))
    except SystemExit as e:
        return e.code
    return 0


def tool_scores(cfg: str, checkpoint: str, tmp_path, tag: str) -> dict:
    """tools/test.py's predicted scores per image path (its ``--out`` dump)."""
    out = str(tmp_path / f'{tag}.pkl')
    assert run_test_tool([cfg, checkpoint, '--work-dir', str(tmp_path / f'work_{tag}'),
                          '--out', out]) == 0
    with open(out, 'rb') as f:
        return {osp.basename(s['img_path']): s['pred_score'] for s in pickle.load(f)}


def assert_same_predictions(got: dict, paths, scores: torch.Tensor) -> None:
    want = {osp.basename(p): s for p, s in zip(paths, scores)}
    assert sorted(got) == sorted(want)
    for name, s in want.items():
        torch.testing.assert_close(got[name], s.float(), rtol=1e-4, atol=1e-6)
    assert scores.std(0).max() > 1e-6  # the images are told apart


def evaluate_by_url_and_path(layout: str, cfg: str, official: dict, server, tmp_path) -> list:
    """tools/test.py's scores for the official file served by URL, then read from a path."""
    body = file_bytes(official, safetensors=layout == 'WeightFormer')
    server.files[ROUTES[layout]] = body
    path = tmp_path / osp.basename(ROUTES[layout].split('?')[0].rstrip('/'))
    path.write_bytes(body)
    return [tool_scores(cfg, server.base + ROUTES[layout], tmp_path, 'url'),
            tool_scores(cfg, str(path), tmp_path, 'path')]


@pytest.mark.parametrize('data', ['generated', pytest.param('imagenet_sample',
                                                            marks=pytest.mark.slow)])
@pytest.mark.parametrize('layout', ['MLLA', 'WeightFormer'])
def test_official_checkpoint_by_url_and_path_predicts_as_the_model(layout, data, server, tmp_path,
                                                                   generated_imagenet):
    if data == 'imagenet_sample':
        if layout != 'MLLA' or not osp.isdir(osp.join(SHARED_DATA, 'imagenet_sample')):
            pytest.skip('the real-image tier: MILA-T on ../shared/data/imagenet_sample')
        root, indices = osp.join(SHARED_DATA, 'imagenet_sample'), 4
    else:
        root, indices = generated_imagenet, None
    cfg = user_config(tmp_path, layout, root, indices)
    model, dataset = seeded_classifier(cfg)
    official = classifier_to_official(layout, model.state_dict(), getattr(model.backbone,
                                                                          'depth', 0))
    paths, batch = preprocessed(model, dataset)
    with torch.no_grad():
        scores = torch.stack([s.pred_score for s in model.predict(batch['inputs'],
                                                                  batch['data_samples'])])
    for got in evaluate_by_url_and_path(layout, cfg, official, server, tmp_path):
        assert_same_predictions(got, paths, scores)
    assert server.requests == [ROUTES[layout]]
    if data == 'generated':
        check_converted_file(layout, cfg, model, official, tmp_path, paths, scores)


def check_converted_file(layout, cfg, model, official, tmp_path, paths, scores) -> None:
    """tools/model_converters/<family>_official.py writes a file that mmengine's own
    load_checkpoint reads strictly into the config's classifier (what mmpretrain's tools do),
    and that tools/test.py evaluates as the official file."""
    from mmengine.runner import load_checkpoint
    from tools.model_converters import mlla_official, weightformer_official
    src, dst = tmp_path / 'official.pth', tmp_path / 'converted.pth'
    torch.save(official, src)
    cli = mlla_official if layout == 'MLLA' else weightformer_official
    assert cli.main([str(src), str(dst)])['arch'] == 'tiny'
    fresh, _ = build(cfg)
    load_checkpoint(fresh, str(dst), map_location='cpu', strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert_same_predictions(tool_scores(cfg, str(dst), tmp_path, 'converted'), paths, scores)


def one_line_error(argv, capsys) -> str:
    assert run_test_tool(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith('ERROR: ') and '\n' not in err and 'Traceback' not in err, err
    return err


def test_a_checkpoint_missing_one_parameter_fails_in_one_line(tmp_path, capsys,
                                                              generated_imagenet):
    cfg = user_config(tmp_path, 'MLLA', generated_imagenet)
    with torch.device('meta'):
        model, _ = build(cfg)
    sd = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()}
    official = classifier_to_official('MLLA', sd, 0)
    del official['model']['layers.2.blocks.5.attn.qk.weight']
    path = tmp_path / 'mlla_t.pth'
    torch.save(official, path)
    err = one_line_error([cfg, str(path), '--work-dir', str(tmp_path / 'w')], capsys)
    assert "1 missing keys ['backbone.layers.2.blocks.5.attn.qk.weight']" in err, err
    # an extra key in a checkpoint of ours is as fatal
    torch.save({'state_dict': {**sd, 'neck.extra': torch.zeros(1)}, 'meta': {}}, path)
    err = one_line_error([cfg, str(path), '--work-dir', str(tmp_path / 'w')], capsys)
    assert "0 missing keys []" in err and "1 unexpected keys ['neck.extra']" in err, err
    # weights through an init_cfg are not what tools/test.py evaluates: refused, not ignored
    err = one_line_error([cfg, str(path), '--cfg-options',
                          f'model.backbone.init_cfg.checkpoint={path}'], capsys)
    assert 'evaluates the weights of its CHECKPOINT argument alone' in err


def test_official_veca_has_no_classifier_and_is_refused_in_one_line(server, tmp_path, capsys,
                                                                    generated_imagenet):
    cfg = user_config(tmp_path, 'VECA', generated_imagenet)
    with torch.device('meta'):
        model, _ = build(cfg)
    sd = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()}
    check_veca_refused(cfg, classifier_to_official('VECA', sd, 12), server, tmp_path, capsys)


def check_veca_refused(cfg, official, server, tmp_path, capsys) -> None:
    body = file_bytes(official, safetensors=False)
    server.files[ROUTES['VECA']] = body
    path = tmp_path / 'veca_small.pt'
    path.write_bytes(body)
    for checkpoint in (server.base + ROUTES['VECA'], str(path)):
        err = one_line_error([cfg, checkpoint, '--work-dir', str(tmp_path / 'w')], capsys)
        assert "(official VECA, converted)" in err and "2 missing keys ['head.fc.weight', " \
            "'head.fc.bias']" in err and "no weights for the model's ['head']" in err, err


# ------------------------------------------------------------- tier (b): the official code
def official_root(layout: str) -> str:
    root = os.environ.get(ROOT_VARS[layout])
    if not root:
        pytest.skip(f'no official {layout} checkout: set {ROOT_VARS[layout]} to run this test')
    if importlib.util.find_spec('timm') is None:
        pytest.skip('the official code imports timm: pip install timm==0.4.12')
    return root


def official_model(layout: str, root: str):
    """The official model (seeded), built as compare_official.py builds it."""
    from tools.analysis_tools import compare_official as co
    torch.manual_seed(0)
    if layout == 'MLLA':
        model = co._load(osp.join(root, 'models', 'mlla.py'), 'official_mlla').MLLA(
            img_size=224, embed_dim=64, depths=[2, 4, 8, 4], num_heads=[2, 4, 8, 16],
            drop_path_rate=0.)
    else:
        model = co._load(osp.join(root, 'model', 'wfm.py'), 'official_wfm').VisionTransformer(
            img_size=224, patch_size=16, embed_dim=192, depth=17)
    return co.perturb_(model).eval()


@pytest.mark.parametrize('layout', ['MLLA', 'WeightFormer'])
def test_the_official_models_own_file_predicts_as_the_official_model(layout, server, tmp_path,
                                                                     generated_imagenet,
                                                                     monkeypatch):
    root = official_root(layout)
    monkeypatch.setattr('sys.path', list(__import__('sys').path))  # the loader extends it
    off = official_model(layout, root)
    cfg = user_config(tmp_path, layout, generated_imagenet)
    model, dataset = build(cfg)  # its preprocessing only
    paths, batch = preprocessed(model, dataset)
    with torch.no_grad():
        scores = off(batch['inputs']).softmax(-1)
    for got in evaluate_by_url_and_path(layout, cfg, {'model': off.state_dict()}, server,
                                        tmp_path):
        assert_same_predictions(got, paths, scores)


def test_the_official_veca_models_own_file_is_refused(server, tmp_path, capsys, monkeypatch,
                                                      generated_imagenet):
    root = official_root('VECA')
    monkeypatch.setattr('sys.path', [root] + __import__('sys').path)
    from veca.config import PretrainConfig, apply_family_preset
    from veca.model import VECA as OfficialVECA
    cfg = PretrainConfig()
    cfg.model_family = 'small'
    apply_family_preset(cfg)
    cfg.init_patch_from_dinov3, cfg.distill_output_dim = False, None  # no download
    official = {'student': OfficialVECA(cfg).state_dict(), 'config': {'model_family': 'small'}}
    check_veca_refused(user_config(tmp_path, 'VECA', generated_imagenet), official, server,
                       tmp_path, capsys)
