"""The package as a user gets it: the sdist, the wheel built from it, and the wheel installed.

A copy of the checkout is built with ``python -m build --no-isolation`` (the sdist, then the wheel
from the sdist, so MANIFEST.in is tested too). The wheel goes into a fresh virtual environment
that reuses this environment's torch and OpenMMLab packages through a ``.pth`` line (nothing is
downloaded; the editable mmeffattn installed here is not on that path, since a ``.pth`` line
adds a folder without running the ``.pth`` files in it). From that install, ``mim train
mmeffattn CONFIG`` runs two iterations on the ImageNet sample (one of our configs by name, and a
user's config with a ``mmeffattn::`` base), a converter from
``mmeffattn/.mim/tools`` converts an official-layout checkpoint, and the benchmark roster finds
its configs in the package.

Slow (minutes: a build and a virtual environment), so behind ``--run-slow``; CI runs this file
as a step of its own.
"""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_JUNK = shutil.ignore_patterns('.git', '.venv', 'build', 'dist', 'work_dirs', 'data', 'outputs',
                               '*.egg-info', '__pycache__', '*.pyc', '.mim', '.pytest_cache',
                               '_build')


def _copy_checkout(dst: str) -> None:
    """The checkout's files (tracked and untracked, minus git-ignored ones), or, without git,
    the tree minus build and environment folders."""
    try:
        listed = subprocess.run(['git', 'ls-files', '-z', '-co', '--exclude-standard'], cwd=ROOT,
                                capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(ROOT, dst, ignore=_JUNK)
        return
    for rel in listed.decode().split('\0'):
        src = osp.join(ROOT, rel)
        if rel and osp.isfile(src):  # a file deleted but not yet staged is listed, absent
            os.makedirs(osp.dirname(osp.join(dst, rel)), exist_ok=True)
            try:
                shutil.copy2(src, osp.join(dst, rel))
            except FileNotFoundError:  # removed meanwhile (another test's scratch file)
                pass


def _run(cmd, cwd, timeout, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (f'{" ".join(map(str, cmd))} failed ({proc.returncode}):\n'
                                  f'{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}')
    return proc


@pytest.fixture(scope='module')
def dists(tmp_path_factory):
    """(sdist path, wheel path, the copied source folder)."""
    tmp = tmp_path_factory.mktemp('build')
    src, out = str(tmp / 'src'), str(tmp / 'dist')
    _copy_checkout(src)
    _run([sys.executable, '-m', 'build', '--no-isolation', '--outdir', out, src], cwd=str(tmp),
         timeout=300)
    sdist = [f for f in os.listdir(out) if f.endswith('.tar.gz')]
    wheel = [f for f in os.listdir(out) if f.endswith('.whl')]
    assert len(sdist) == 1 and len(wheel) == 1, os.listdir(out)
    return osp.join(out, sdist[0]), osp.join(out, wheel[0]), src


def _files_under(src: str, folder: str):
    return sorted(osp.relpath(osp.join(d, f), src)
                  for d, _, files in os.walk(osp.join(src, folder)) for f in files
                  if '__pycache__' not in d and not f.endswith('.pyc'))


def test_sdist_has_what_the_wheel_build_reads(dists):
    sdist, _, src = dists
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split('/')[0]
        names = {n[len(top) + 1:] for n in tar.getnames()}
    for required in ('pyproject.toml', 'setup.py', 'MANIFEST.in', 'README.md', 'LICENSE',
                     'NOTICE', 'CITATION.cff', 'CHANGELOG.md', 'model-index.yml',
                     'requirements/runtime.txt', 'requirements/deploy.txt',
                     'requirements/tests.txt', 'requirements/docs.txt',
                     'requirements/constraints.txt', 'mmeffattn/__init__.py'):
        assert required in names, f'{required} is missing from the sdist'
    missing = [f for f in _files_under(src, 'configs') + _files_under(src, 'tools')
               if f not in names]
    assert not missing, f'the sdist lacks {missing[:10]}'
    assert not [n for n in names if n.startswith('mmeffattn/.mim')], 'stale .mim in the sdist'


def test_wheel_carries_all_configs_and_tools(dists):
    _, wheel, src = dists
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith('.dist-info/METADATA'))
        metadata = z.read(meta_name).decode()
    expected = _files_under(src, 'configs') + _files_under(src, 'tools')
    assert len(expected) > 60
    missing = [f for f in expected if f'mmeffattn/.mim/{f}' not in names]
    assert not missing, f'the wheel lacks {missing[:10]}'
    for sub in ('model_converters', 'analysis_tools', 'deployment'):
        assert any(n.startswith(f'mmeffattn/.mim/tools/{sub}/') and n.endswith('.py')
                   for n in names), sub
    assert 'mmeffattn/.mim/model-index.yml' in names
    assert not [n for n in names if n.startswith(('tests/', 'tools/', 'configs/'))]
    assert any(n.endswith('.dist-info/licenses/LICENSE') for n in names)
    assert any(n.endswith('.dist-info/licenses/NOTICE') for n in names)
    assert 'License-Expression: Apache-2.0' in metadata
    assert 'Requires-Dist: torch>=2.7' in metadata
    assert 'Requires-Dist: mmdet<3.4,>=3.3; extra == "all"' in metadata
    assert 'Requires-Dist: safetensors' in metadata


@pytest.fixture(scope='module')
def installed(dists, tmp_path_factory):
    """A fresh venv with the wheel installed, reusing this environment's packages; returns its
    python and its site-packages."""
    _, wheel, _ = dists
    env_dir = str(tmp_path_factory.mktemp('wheel_env') / 'venv')
    _run([sys.executable, '-m', 'venv', '--without-pip', env_dir], cwd=ROOT, timeout=120)
    python = osp.join(env_dir, 'bin', 'python')
    site = _run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                cwd=env_dir, timeout=60).stdout.strip()
    here = sysconfig.get_paths()
    with open(osp.join(site, 'reuse_outer_env.pth'), 'w') as f:  # folders only, no .pth runs
        f.write('\n'.join(dict.fromkeys([here['purelib'], here['platlib']])) + '\n')
    # --ignore-installed: pip neither looks at nor touches the outer environment's mmeffattn
    _run([python, '-m', 'pip', 'install', '--no-deps', '--no-index', '--ignore-installed',
          '--disable-pip-version-check', '-q', wheel], cwd=env_dir, timeout=300)
    where = _run([python, '-c', 'import mmeffattn, mmdet; print(mmeffattn.__file__)'],
                 cwd=env_dir, timeout=120, env=_clean_env()).stdout.strip()
    assert where.startswith(site), f'mmeffattn imported from {where}, not the wheel in {site}'
    return python, site


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'TRITON_INTERPRET', 'VIRTUAL_ENV')}
    env.update(PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1', **extra)
    return env


def _mim_train(installed, generated_data, tmp_path, config: str) -> str:
    """`mim train mmeffattn CONFIG` for two iterations on generated ImageNet-layout shapes;
    returns the log."""
    python, _ = installed
    root = generated_data('imagenet') + '/'
    options = [
        f'train_dataloader.dataset.data_root={root}', 'train_dataloader.dataset.split=val',
        'train_dataloader.dataset.indices=4', 'train_dataloader.batch_size=2',
        'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
        # one epoch; the cosine schedule that starts after warm-up epoch 20 starts at 0
        'train_cfg.max_epochs=1', 'param_scheduler.1.begin=0', 'val_cfg=None',
        'val_dataloader=None', 'val_evaluator=None',
        'test_cfg=None', 'test_dataloader=None', 'test_evaluator=None',
        'default_hooks.logger.interval=1', 'default_hooks.checkpoint=None']
    proc = _run([python, '-m', 'mim', 'train', 'mmeffattn', config,
                 '--work-dir', str(tmp_path / 'work'), '--cfg-options', *options],
                cwd=str(tmp_path), timeout=600, env=_clean_env())
    log = proc.stdout + proc.stderr
    assert 'Epoch(train) [1][2/2]' in log, log[-3000:]
    assert 'loss:' in log
    return log


def test_mim_train_from_the_wheel(installed, generated_data, tmp_path):
    """`mim train mmeffattn <config name>` finds the config and tools/train.py in the installed
    package and trains two iterations on the ImageNet sample."""
    _, site = installed
    log = _mim_train(installed, generated_data, tmp_path, 'weightformer-t_8xb256_in1k.py')
    config = osp.join(site, 'mmeffattn', '.mim', 'configs', 'weightformer',
                      'weightformer-t_8xb256_in1k.py')
    assert f'will use {config} instead' in log, log[-3000:]


def test_mim_train_a_user_config_with_a_package_base(installed, generated_data, tmp_path):
    """A user's own config that inherits ours by ``mmeffattn::`` trains through mim (mim runs our
    tools/train.py, which resolves the base from the installed package)."""
    user = tmp_path / 'my_weightformer.py'
    user.write_text("_base_ = 'mmeffattn::weightformer/weightformer-t_8xb256_in1k.py'\n"
                    "model = dict(backbone=dict(drop_path_rate=0.05))\n")
    _mim_train(installed, generated_data, tmp_path, str(user))
    dumped = (tmp_path / 'work' / 'my_weightformer.py').read_text()
    assert 'drop_path_rate=0.05' in dumped and "type='mmeffattn.WeightFormer'" in dumped, dumped


def test_converter_from_the_wheel(installed, tmp_path):
    """tools/model_converters/weightformer_official.py, run from mmeffattn/.mim in the install,
    converts an official-layout WeightFormer checkpoint (dim 32, depth 3: block 1 dynamic)."""
    python, site = installed
    dim, hidden, r = 32, 128, 4
    g = torch.Generator().manual_seed(0)
    shapes = {'patch_embed.proj.weight': (dim, 3, 16, 16), 'patch_embed.proj.bias': (dim, ),
              'init_norm.weight': (dim, ), 'init_norm.bias': (dim, ),
              'norm.weight': (dim, ), 'norm.bias': (dim, ),
              'head.weight': (1000, dim), 'head.bias': (1000, )}
    for i in range(3):
        p = f'blocks.{i}.'
        shapes.update({p + 'norm2.weight': (dim, ), p + 'norm2.bias': (dim, ),
                       p + 'linear2.weight': (dim, hidden), p + 'linear2.bias': (dim, )})
        if i == 1:  # official rule: block i is dynamic when (i + 2) % 3 == 0
            shapes.update({
                p + 'norm1.weight': (dim, ), p + 'norm1.bias': (dim, ),
                p + 'linear1.w': (dim, hidden), p + 'linear1.b': (hidden, ),
                p + 'linear1.wfm.weight': (dim // r + hidden // r, dim),
                p + 'linear1.wfm.bias': (dim // r + hidden // r, ),
                p + 'linear1.w1': (dim // r, dim), p + 'linear1.w2': (hidden // r, hidden),
                p + 'dwc.w': (dim, 1, 3, 3), p + 'dwc.b': (dim, ),
                p + 'dwc.wfm.0.weight': (dim, dim, 1, 1), p + 'dwc.wfm.0.bias': (dim, ),
                p + 'dwc.wfm.2.weight': (dim, dim, 1, 1)})
        else:
            shapes.update({p + 'linear1.weight': (hidden, dim), p + 'linear1.bias': (hidden, ),
                           p + 'dwc.weight': (dim, 1, 3, 3), p + 'dwc.bias': (dim, )})
    official = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    src, dst = str(tmp_path / 'wfm.pth'), str(tmp_path / 'wfm_mmpretrain.pth')
    torch.save({'model': official, 'epoch': 7}, src)
    script = osp.join(site, 'mmeffattn', '.mim', 'tools', 'model_converters',
                      'weightformer_official.py')
    proc = _run([python, script, src, dst], cwd=str(tmp_path), timeout=300, env=_clean_env())
    assert 'arch embed_dims=32' in proc.stdout, proc.stdout
    converted = torch.load(dst, map_location='cpu', weights_only=True)
    sd = converted['state_dict']
    assert converted['meta']['epoch'] == 7
    # the official dynamic linear stores [in, out]; nn.Linear's weight is [out, in]
    assert torch.equal(sd['backbone.blocks.1.mlp.fc1.weight'], official['blocks.1.linear1.w'].t())
    assert torch.equal(sd['head.fc.weight'], official['head.weight'])
    assert len(sd) == len(official)


def test_benchmark_roster_from_the_wheel(installed, tmp_path):
    """mmeffattn.analysis.model_zoo finds every config of ours inside the installed package and
    builds a classifier from one; tools/benchmark.py runs from ``mmeffattn/.mim/tools``."""
    python, site = installed
    code = ('import os.path as osp, torch\n'
            'from mmeffattn.analysis import model_zoo as zoo\n'
            'for name in zoo.OURS + zoo.ZOO:\n'
            '    assert osp.isfile(zoo.resolve_config(zoo.get_model(name).classifier)), name\n'
            'model = zoo.build_classifier("WeightFormer-T")\n'
            'print(zoo.package_configs())\n'
            'print(tuple(model(torch.randn(1, 3, 64, 64), mode="tensor").shape))\n')
    proc = _run([python, '-c', code], cwd=str(tmp_path), timeout=300, env=_clean_env())
    assert proc.stdout.splitlines()[-2:] == [
        osp.join(site, 'mmeffattn', '.mim', 'configs'), '(1, 1000)'], proc.stdout[-2000:]
    out = tmp_path / 'bench'
    _run([python, osp.join(site, 'mmeffattn', '.mim', 'tools', 'benchmark.py'), '--preset',
          'smoke', '--models', 'SEMA-T', 'ResNet-50', '--sizes', '32', '--warmup', '0',
          '--repeats', '1', '--backward-max-side', '0', '--no-flops', '--no-plots',
          '--out-dir', str(out)], cwd=str(tmp_path), timeout=600, env=_clean_env())
    report = json.loads((out / 'benchmark.json').read_text())
    assert [(r['model'], r['status']) for r in report['results']] == [('SEMA-T', 'ok'),
                                                                     ('ResNet-50', 'ok')]
