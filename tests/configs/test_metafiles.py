"""model-index.yml and the configs' metafiles, in OpenMMLab's format.

- Every config under configs/ is listed once; only the demo's config is left out, by name.
- Each entry carries Metadata (FLOPs, Parameters, Training Data, Epochs, Batch Size); Results hold
  only what the listed official weights are reported to reach; Weights are direct URLs, cited.
- Parameters and FLOPs equal what ``tools/analysis_tools/get_flops.py`` measures for the config
  (the whole model at the config's own input size, :func:`input_shape`: a classifier at its test
  crop, a distillation config at its training crop, a COCO detector at 800x1280, an UperNet at
  512x2048 for a whole-image test or at its sliding window). Models are keyed by their ``model`` dict without
  the keys that change neither count (drop path, init and training settings), and each distinct
  model is counted once. Parameters are checked for every config in the default suite; FLOPs for
  two small ImageNet classifiers there (a forward at 224x224), and for every config with
  ``--run-slow`` (a detector or segmentor is a forward at 800x1280 or 512x2048: 30-60 s each on a
  CPU, minutes for the zoo's global-softmax Mask R-CNN).

To refresh the numbers after a model change::

    PYTHONPATH=. python tests/configs/test_metafiles.py CONFIG [CONFIG ...]   # prints Parameters and FLOPs
"""
import glob
import json
import os.path as osp
import re
import sys
from functools import lru_cache

import pytest
import yaml

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: configs that no metafile lists, on purpose: the demo trains on generated shapes
NOT_IN_METAFILES = {'configs/demo/mask-rcnn_sema-t_fpn_shapes.py'}
METADATA_KEYS = ('FLOPs', 'Parameters', 'Training Data', 'Epochs', 'Batch Size')
#: keys of a model dict that change neither the parameter count nor an eval forward's FLOPs
_IRRELEVANT = {'drop_path_rate', 'init_cfg', 'pretrained', 'train_cfg', 'data_preprocessor',
               'frozen_stages', 'norm_eval', 'with_cp', 'teacher_ckpt', 'teacher_ckpt_prefix'}


def metafiles():
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    return index['Import']


def entries():
    """``[(metafile, model entry), ...]`` over every metafile."""
    out = []
    for path in metafiles():
        with open(osp.join(ROOT, path)) as f:
            meta = yaml.safe_load(f)
        out += [(path, m) for m in meta['Models']]
    return out


def all_configs():
    paths = glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    return sorted(osp.relpath(p, ROOT) for p in paths)


def _strip(node):
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in sorted(node.items()) if k not in _IRRELEVANT}
    if isinstance(node, (list, tuple)):
        return [_strip(v) for v in node]
    return node


@lru_cache(maxsize=None)
def model_key(config: str) -> str:
    """The config's model dict, less what changes neither count: configs with the same key have
    the same Parameters and FLOPs."""
    from mmengine.config import Config

    import mmeffattn  # noqa: F401
    cfg = Config.fromfile(osp.join(ROOT, config))
    return json.dumps(_strip(cfg.model.to_dict()), sort_keys=True, default=repr)


def _tool():
    from tools.analysis_tools import get_flops
    return get_flops


@lru_cache(maxsize=None)
def measure_params(key_config: str) -> int:
    """Parameters of the whole model of ``key_config``, as get_flops.py reports them
    (``count_parameters`` of its ``build``). Built on the meta device where the model allows it:
    the same parameter shapes, without allocating or initialising them."""
    import torch

    from mmeffattn.analysis.flops import count_parameters
    path = osp.join(ROOT, key_config)
    try:
        with torch.device('meta'):
            model = _tool().build(path)
    except (NotImplementedError, RuntimeError):  # a model that copies data while it is built
        model = _tool().build(path)
    return count_parameters(model)


@lru_cache(maxsize=None)
def input_shape(config: str) -> tuple:
    """``(H, W)`` the config's model sees: a classifier's test crop (or resize), a distiller's
    training crop, a segmentor's sliding window (whole-image test: mmseg's 512x2048), a
    detector's 800x1280 (mmdet's convention for a 1333x800 test scale)."""
    from mmengine.config import Config

    import mmeffattn.engine.patch_mmengine  # noqa: F401  (mmdet::/mmseg:: bases)
    cfg = Config.fromfile(osp.join(ROOT, config))
    kind = cfg.model.type.split('.')[-1]
    if kind in ('MaskRCNN', 'RetinaNet'):
        return (800, 1280)
    if kind == 'EncoderDecoder':
        test_cfg = cfg.model.get('test_cfg') or {}
        return tuple(test_cfg['crop_size']) if test_cfg.get('mode') == 'slide' else (512, 2048)
    loader = cfg.get('test_dataloader') or cfg.get('val_dataloader') or cfg.train_dataloader
    for step in reversed(loader['dataset']['pipeline']):
        size = step.get('crop_size') if 'Crop' in step['type'] else step.get('scale')
        if size is not None and step['type'] in ('CenterCrop', 'RandomCrop', 'Resize'):
            return (size, size) if isinstance(size, int) else tuple(size)[::-1]
    raise ValueError(f'{config}: no crop or resize in its pipeline to take the input size from')


@lru_cache(maxsize=None)
def measure(key_config: str, shape: tuple = None) -> dict:
    """``dict(kind, params, flops, shape)`` of the whole model at ``shape`` (default: the
    config's own, :func:`input_shape`), by get_flops.py's own ``count``."""
    shape = shape or input_shape(key_config)
    r = _tool().count(osp.join(ROOT, key_config), shape)
    whole = r.get('model', r)
    return dict(kind=r['kind'], params=whole['params'], flops=whole['flops'],
                shape=list(r['shape']))


_PARAMS, _COUNTS = {}, {}  # by model key: configs with the same model are counted once


def _params_by_key(key: str, config: str) -> int:
    if key not in _PARAMS:
        _PARAMS[key] = measure_params(config)
    return _PARAMS[key]


def _count_by_key(key: str, config: str) -> dict:
    key = (key, input_shape(config))
    if key not in _COUNTS:
        _COUNTS[key] = measure(config)
    return _COUNTS[key]


#: FLOPs counted in the default suite: the two cheapest ImageNet classifiers at 224x224 and one at
#: 448x448 (a few seconds each; MILA-T's count is checked against MLLA's figure in
#: tests/tools/test_get_flops.py); every other config's FLOPs with --run-slow
FLOPS_IN_DEFAULT_SUITE = {
    'configs/weightformer/weightformer-t_8xb256_in1k.py',
    'configs/laplacianformer/laplacianformer-t_8xb128_in1k.py',
    'configs/weightformer/weightformer-b_8xb256_in1k-448px.py'}  # at its own 448x448


def _entry_params(flops: bool):
    params = []
    for path, m in entries():
        slow = flops and m['Config'] not in FLOPS_IN_DEFAULT_SUITE
        params.append(pytest.param(path, m, id=m['Name'],
                                   marks=[pytest.mark.slow] if slow else []))
    return params


@pytest.mark.parametrize('config,shape', [
    ('configs/sema/sema-t_8xb128_in1k.py', (224, 224)),
    ('configs/sema/sema-t_in1k-test-672px.py', (672, 672)),
    ('configs/sema/sema-t_8xb16-30e_in1k-1024px.py', (1024, 1024)),
    ('configs/weightformer/weightformer-b_8xb256_in1k-448px.py', (448, 448)),
    ('configs/veca/veca-s_distill_vit-b16-approx-dinov3_in1k.py', (256, 256)),
    ('configs/veca/veca-s_upernet_8xb2-80k_pascal-context-59-480x480.py', (480, 480)),
    ('configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py', (512, 2048)),
    ('configs/mila/retinanet_mila-t_fpn_1x_coco.py', (800, 1280))])
def test_input_shape_is_the_configs_own(config, shape):
    """The metafiles count each config at the size its model sees, not one size per kind."""
    assert input_shape(config) == shape


def test_model_index_imports_exist():
    files = metafiles()
    assert files, 'model-index.yml imports no metafile'
    for path in files:
        assert osp.isfile(osp.join(ROOT, path)), f'model-index.yml imports missing {path}'


def test_every_config_is_listed_once():
    listed = [m['Config'] for _, m in entries()]
    dupes = {c for c in listed if listed.count(c) > 1}
    assert not dupes, f'configs listed more than once: {sorted(dupes)}'
    missing = set(all_configs()) - set(listed) - NOT_IN_METAFILES
    assert not missing, (f'configs in no metafile: {sorted(missing)}; add each to its family\'s '
                         f'configs/<family>/metafile.yml (or to NOT_IN_METAFILES, with a reason)')
    stale = NOT_IN_METAFILES - set(all_configs())
    assert not stale, f'NOT_IN_METAFILES names configs that no longer exist: {sorted(stale)}'


@pytest.mark.parametrize('path', metafiles())
def test_metafile(path):
    with open(osp.join(ROOT, path)) as f:
        meta = yaml.safe_load(f)
    collections = {c['Name'] for c in meta['Collections']}
    from mmeffattn import __version__
    for c in meta['Collections']:
        where = f'{path}: {c["Name"]}'
        if 'Paper' in c:  # the attention zoo is this project's own: no paper
            assert re.match(r'https?://\S+$', c['Paper']['URL']), f'{where}: paper URL'
        assert osp.isfile(osp.join(ROOT, c['README'])), f'{where}: README {c["README"]}'
        assert osp.isfile(osp.join(ROOT, c['Code']['URL'])), f'{where}: Code {c["Code"]["URL"]}'
        assert c['Code']['Version'] == f'v{__version__}', f'{where}: Code Version'
    names = [m['Name'] for m in meta['Models']]
    assert len(names) == len(set(names)), f'{path}: duplicate model names'
    for model in meta['Models']:
        where = f"{path}: {model['Name']}"
        assert model['In Collection'] in collections, where
        config = osp.join(ROOT, model['Config'])
        assert osp.isfile(config), f'{where}: config {model["Config"]} does not exist'
        assert osp.splitext(osp.basename(config))[0] == model['Name'], where
        meta_data = model.get('Metadata', {})
        missing = [k for k in METADATA_KEYS if k not in meta_data]
        assert not missing, f'{where}: Metadata lacks {missing}'
        for k in ('Parameters', 'FLOPs'):
            assert isinstance(meta_data[k], int) and meta_data[k] > 0, f'{where}: {k}'
        results = model.get('Results')
        assert isinstance(results, list), f'{where}: no Results list'
        # Results are what the listed weights reach: none without Weights
        assert not results or 'Weights' in model, f'{where}: Results without Weights'
        for r in results:
            assert {'Task', 'Dataset', 'Metrics'} <= set(r), f'{where}: Result {r}'
            assert r['Metrics'] and all(isinstance(v, (int, float))
                                        for v in r['Metrics'].values()), f'{where}: {r}'
        if 'Weights' in model:
            assert re.match(r'https?://\S+$', model['Weights']), f'{where}: Weights not a URL'


@pytest.mark.parametrize('path', metafiles())
def test_family_page_shows_the_metafile_counts(path):
    """The collection's README lists every model of the metafile with its input size and the
    metafile's Parameters and FLOPs (in M and G, two decimals)."""
    with open(osp.join(ROOT, path)) as f:
        meta = yaml.safe_load(f)
    (collection, ) = meta['Collections']
    page = open(osp.join(ROOT, collection['README']), encoding='utf-8').read()
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r'^\| [^|]+ \| \[([^\]]+)\]\([^)]+\) \| (\d+)x(\d+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \|',
        page, flags=re.M)}
    for m in meta['Models']:
        where = f"{collection['README']}: {m['Name']}"
        assert m['Name'] in rows, f'{where}: no row for this config'
        h, w, params, flops = rows[m['Name']]
        assert (int(h), int(w)) == input_shape(m['Config']), f'{where}: input'
        assert params == f"{m['Metadata']['Parameters'] / 1e6:.2f}", f'{where}: params'
        assert flops == f"{m['Metadata']['FLOPs'] / 1e9:.2f}", f'{where}: FLOPs'


def test_official_weights_are_cited():
    """Every Weights URL has a comment above it naming the README it comes from."""
    for path in metafiles():
        lines = open(osp.join(ROOT, path)).read().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith('Weights:'):
                above = '\n'.join(lines[max(0, i - 6):i])
                assert re.search(r'(github\.com|huggingface\.co)/\S+ README', above), \
                    f'{path}:{i + 1}: uncited'


@pytest.mark.usefixtures('torch_ops')
@pytest.mark.parametrize('path,m', _entry_params(flops=False))
def test_parameters_equal_the_tool(path, m):
    """Models that share a key (same model dict, less drop path and init) are counted once."""
    measured = _params_by_key(model_key(m['Config']), m['Config'])
    assert m['Metadata']['Parameters'] == measured, (
        f"{path}: {m['Name']}: Parameters {m['Metadata']['Parameters']}, but get_flops.py "
        f'counts {measured}: update the metafile (PYTHONPATH=. python '
        f"tests/configs/test_metafiles.py {m['Config']})")


@pytest.mark.usefixtures('torch_ops', 'one_thread')
@pytest.mark.parametrize('path,m', _entry_params(flops=True))
def test_flops_equal_the_tool(path, m):
    measured = _count_by_key(model_key(m['Config']), m['Config'])
    assert m['Metadata']['FLOPs'] == measured['flops'], (
        f"{path}: {m['Name']}: FLOPs {m['Metadata']['FLOPs']}, but get_flops.py counts "
        f"{measured['flops']} at {measured['shape']}: update the metafile "
        f"(PYTHONPATH=. python tests/configs/test_metafiles.py {m['Config']})")
    assert m['Metadata']['Parameters'] == measured['params'], f"{path}: {m['Name']}"


if __name__ == '__main__':
    import os
    os.environ.setdefault('MMEFFATTN_OPS_BACKEND', 'torch')
    for config in sys.argv[1:]:
        r = measure(osp.relpath(osp.abspath(config), ROOT))
        print(json.dumps(dict(config=config, **r)), flush=True)
