"""The release metadata agrees with itself: the pins with the ranges, the citation file with CFF."""
import os.path as osp
import re
import sys

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _requirements(path):
    with open(osp.join(ROOT, path)) as f:
        lines = [ln.split('#')[0].strip() for ln in f]
    return [Requirement(ln) for ln in lines if ln]


def _pyproject():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    with open(osp.join(ROOT, 'pyproject.toml'), 'rb') as f:
        return tomllib.load(f)


def test_every_pin_lies_in_the_declared_ranges():
    """constraints.txt pins what setup.sh installs; each pin must satisfy every range the package
    and its extras declare, or a user's `pip install mmeffattn[all]` and CI would differ."""
    pins = {}
    for req in _requirements('requirements/constraints.txt'):
        spec = list(req.specifier)
        if len(spec) == 1 and spec[0].operator == '==':
            pins[req.name.lower()] = Version(spec[0].version)
    declared = [Requirement(r) for r in _pyproject()['project']['dependencies']]
    for extra in ('runtime', 'deploy', 'tests', 'docs'):
        declared += _requirements(f'requirements/{extra}.txt')
    checked = 0
    for req in declared:
        pin = pins.get(req.name.lower())
        if pin is not None:
            assert req.specifier.contains(pin, prereleases=True), \
                f'{req.name}=={pin} (constraints.txt) is outside {req} (declared)'
            checked += 1
    assert checked >= 15, checked
    for name in ('torch', 'torchvision', 'mmcv', 'mmengine', 'mmdet', 'openmim', 'safetensors'):
        assert name in pins, f'constraints.txt pins no {name}'


def test_extras_are_ranges_not_pins():
    for extra in ('runtime', 'deploy', 'tests', 'docs'):
        for req in _requirements(f'requirements/{extra}.txt'):
            assert not any(s.operator in ('==', '===') for s in req.specifier), \
                f'requirements/{extra}.txt pins {req}: pins belong in constraints.txt'


def test_pyproject_extras_and_version():
    project = _pyproject()
    dynamic = project['tool']['setuptools']['dynamic']
    assert dynamic['version'] == {'attr': 'mmeffattn.version.__version__'}
    assert set(dynamic['optional-dependencies']) == {'all', 'deploy', 'tests', 'docs'}
    assert project['project']['license'] == 'Apache-2.0'
    torch_req = next(Requirement(r) for r in project['project']['dependencies']
                     if r.startswith('torch'))
    assert not torch_req.specifier.contains('2.6.0') and torch_req.specifier.contains('2.7.0')


def test_citation_file_lists_the_project_and_the_papers():
    with open(osp.join(ROOT, 'CITATION.cff')) as f:
        cff = yaml.safe_load(f)
    for key in ('cff-version', 'message', 'title', 'authors', 'license', 'version'):
        assert cff.get(key), key
    with open(osp.join(ROOT, 'mmeffattn', 'version.py')) as f:
        version = re.search(r"__version__ = '([^']+)'", f.read()).group(1)
    assert str(cff['version']) == version
    titles = ' | '.join(r['title'] for r in cff['references'])
    for paper in ('SEMA', 'Demystify Mamba', 'Linear-Time Global Visual Modeling',
                  'Elastic Attention Cores', 'LaplacianFormer'):
        assert paper in titles, paper
    for ref in cff['references']:
        assert ref['type'] in ('article', 'conference-paper'), ref['title']
        assert isinstance(ref['year'], int) and ref['authors'], ref['title']
        assert all(a.get('family-names') and a.get('given-names') for a in ref['authors'])


def test_notice_names_each_official_repository_and_its_license():
    with open(osp.join(ROOT, 'NOTICE')) as f:
        notice = f.read()
    for repo in ('LeapLabTHU/MLLA', 'LeapLabTHU/WeightFormer', 'alansong1322/VECA',
                 'fudan-zvg/SOFT', 'BirdWithDreams/LaplacianFormer'):
        block = notice[notice.index(repo):][:700]
        assert re.search(r'MIT License|No license is stated', block), repo
