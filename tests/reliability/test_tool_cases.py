"""Small tool cases: an invalid annotation JSON names the file; tools/test.py keeps the training
config dump; the dist scripts find the project's .venv without an activated environment."""
import glob
import os
import os.path as osp
import shutil
import stat
import subprocess

import pytest
from mmengine.config import Config

from reliability_toys import ROOT, load_tool, toy_config

pytestmark = pytest.mark.usefixtures('one_thread')


def _coco_cfg(tmp_path, ann_text: str) -> Config:
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'train2017').mkdir()
    (root / 'annotations' / 'train.json').write_text(ann_text)
    ds = dict(type='CocoDataset', data_root=str(root) + '/', ann_file='annotations/train.json',
              data_prefix=dict(img='train2017/'))
    return Config(dict(train_dataloader=dict(dataset=ds),
                       val_evaluator=dict(type='CocoMetric',
                                          ann_file=str(root / 'annotations' / 'train.json'))))


@pytest.mark.parametrize('text', ['{"images": [], "annotations": [', '', '<html>not found</html>'],
                         ids=['truncated', 'empty', 'html'])
def test_invalid_annotation_json_names_the_file(tmp_path, text):
    from mmeffattn.engine import AnnotationFileError, check_dataset_paths
    cfg = _coco_cfg(tmp_path, text)
    with pytest.raises(AnnotationFileError) as exc:
        check_dataset_paths(cfg, ['train'])
    msg = str(exc.value)
    assert osp.join('annotations', 'train.json') in msg and 'train_dataloader.dataset' in msg


def test_large_annotation_json_gets_the_cheap_check(tmp_path, monkeypatch):
    from mmeffattn.engine import AnnotationFileError, check_dataset_paths, data_check
    monkeypatch.setattr(data_check, 'FULL_JSON_CHECK_BYTES', 8)
    check_dataset_paths(_coco_cfg(tmp_path / 'ok', '{"images": []}'), ['train'])
    with pytest.raises(AnnotationFileError, match='truncated or not JSON'):
        check_dataset_paths(_coco_cfg(tmp_path / 'bad', '{"images": [1, 2'), ['train'])


def test_valid_annotation_json_passes(tmp_path):
    from mmeffattn.engine import check_dataset_paths
    check_dataset_paths(_coco_cfg(tmp_path, '{"images": [], "annotations": []}'), ['train'])


def test_test_tool_keeps_the_training_config_dump(tmp_path):
    extra = '''
test_dataloader = dict(batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler',
                       shuffle=False), dataset=dict(type='ReliabilityToyDataset', size=8))
test_evaluator = dict(type='ReliabilityToyMetric')
test_cfg = dict()
'''
    cfg = toy_config(tmp_path / 'toy.py', max_steps=2, interval=2, extra=extra)
    work = str(tmp_path / 'work')
    load_tool('train').main([cfg, '--work-dir', work])
    dump = osp.join(work, 'toy.py')
    with open(dump) as f:
        train_dump = f.read()
    load_tool('test').main([cfg, osp.join(work, 'iter_2.pth'), '--work-dir', work,
                            '--cfg-options', 'test_dataloader.batch_size=2'])
    with open(dump) as f:
        assert f.read() == train_dump  # main overwrote it with the test run's config
    test_dumps = glob.glob(osp.join(work, '*', 'test_toy.py'))
    assert len(test_dumps) == 1 and 'batch_size=2' in open(test_dumps[0]).read()
    assert not glob.glob(osp.join(work, '2*.py'))  # no stray <timestamp>.py left in the work dir


def _fake_python(path, tag):
    path.write_text(f'#!/bin/sh\necho "{tag} $@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize('script', ['dist_train.sh', 'dist_test.sh'])
def test_dist_scripts_use_the_project_venv(tmp_path, script):
    """Without an activated venv, the scripts run the project's .venv/bin/python (the README's
    set-up), else python from PATH; $PYTHON and an active venv still win."""
    proj = tmp_path / 'proj'
    (proj / 'tools').mkdir(parents=True)
    shutil.copy(osp.join(ROOT, 'tools', script), proj / 'tools' / script)
    (proj / '.venv' / 'bin').mkdir(parents=True)
    _fake_python(proj / '.venv' / 'bin' / 'python', 'VENV')
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    _fake_python(bindir / 'python', 'PATH')
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHON', 'VIRTUAL_ENV', 'CONDA_PREFIX')}
    env['PATH'] = f'{bindir}{os.pathsep}{env["PATH"]}'
    args = ['bash', str(proj / 'tools' / script), 'cfg.py', 'ckpt.pth', '2']

    def run(**extra):
        out = subprocess.run(args, env=dict(env, **extra), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[0]

    assert run() == 'VENV'
    assert run(VIRTUAL_ENV='/some/venv') == 'PATH'
    assert run(PYTHON=str(bindir / 'python')) == 'PATH'
    shutil.rmtree(proj / '.venv')
    assert run() == 'PATH'


@pytest.mark.parametrize('config,phase,keys,absent', [
    ('configs/mask_rcnn_sema_t_3x.py', 'test',
     ['test_dataloader.dataset.data_root=/path/to/dataset/',
      'test_evaluator.ann_file=/path/to/dataset/annotations/instances_val2017.json'],
     ['train_dataloader']),
    ('configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py', 'train',
     ['(the layout ADE20KDataset expects)', 'train_dataloader.dataset.data_root=',
      'val_dataloader.dataset.data_root='], ['coco', 'evaluator']),
    ('configs/sema/sema-t_8xb128_in1k.py', 'test',
     ['(the layout ImageNet expects)', 'test_dataloader.dataset.data_root='],
     ['coco', 'train_dataloader']),
], ids=['coco-test', 'ade20k-train', 'imagenet-test'])
def test_missing_dataset_fix_names_the_phase_keys(tmp_path, config, phase, keys, absent):
    """The fix names the keys of the datasets that are missing (test.py's test_dataloader, not
    the training ones) and, for COCO, the evaluator's annotation file; no COCO advice for others."""
    from mmeffattn.engine import check_dataset_paths
    cfg = Config.fromfile(config)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(tmp_path / 'absent') + '/'
    with pytest.raises(FileNotFoundError) as exc:
        check_dataset_paths(cfg, [phase])
    fix = str(exc.value).splitlines()[-1]
    for key in keys:
        assert key in fix, fix
    for word in absent:
        assert word not in fix.lower(), fix
