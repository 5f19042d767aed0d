"""model-index.yml and the configs' metafiles: they parse, every config they list exists, and each
model has a ``Results`` list (empty until measured) and, where given, ``Weights`` as a URL."""
import os.path as osp
import re

import pytest
import yaml

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def metafiles():
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    return index['Import']


def test_model_index_imports_exist():
    files = metafiles()
    assert files, 'model-index.yml imports no metafile'
    for path in files:
        assert osp.isfile(osp.join(ROOT, path)), f'model-index.yml imports missing {path}'


@pytest.mark.parametrize('path', metafiles())
def test_metafile(path):
    with open(osp.join(ROOT, path)) as f:
        meta = yaml.safe_load(f)
    collections = {c['Name'] for c in meta['Collections']}
    names = [m['Name'] for m in meta['Models']]
    assert len(names) == len(set(names)), f'{path}: duplicate model names'
    for model in meta['Models']:
        where = f"{path}: {model['Name']}"
        assert model['In Collection'] in collections, where
        config = osp.join(ROOT, model['Config'])
        assert osp.isfile(config), f'{where}: config {model["Config"]} does not exist'
        assert osp.splitext(osp.basename(config))[0] == model['Name'], where
        assert isinstance(model.get('Results'), list), f'{where}: no Results list'
        if 'Weights' in model:
            assert re.match(r'https?://\S+$', model['Weights']), f'{where}: Weights not a URL'


def test_official_weights_are_cited():
    """Every Weights URL has a comment above it naming the README it comes from."""
    for path in metafiles():
        lines = open(osp.join(ROOT, path)).read().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith('Weights:'):
                above = '\n'.join(lines[max(0, i - 6):i])
                assert re.search(r'github\.com/\S+ README', above), f'{path}:{i + 1}: uncited'
