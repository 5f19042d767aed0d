"""Small tool cases: an invalid annotation JSON names the file; tools/test.py keeps the training
config dump, takes a folder for --out-json and draws every classification test image for
--show-dir; --launcher slurm/mpi on a CPU is refused by name; the dist scripts find the project's
.venv without an activated environment."""
import glob
import json
import os
import os.path as osp
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from reliability_toys import ROOT, load_tool, tool_env, toy_config

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


#: a test loop for the toy config (toy_config(..., extra=TOY_TEST))
TOY_TEST = '''
test_dataloader = dict(batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler',
                       shuffle=False), dataset=dict(type='ReliabilityToyDataset', size=8))
test_evaluator = dict(type='ReliabilityToyMetric')
test_cfg = dict()
'''


def test_test_tool_keeps_the_training_config_dump(tmp_path):
    cfg = toy_config(tmp_path / 'toy.py', max_steps=2, interval=2, extra=TOY_TEST)
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


def _untrained_toy_checkpoint(path) -> str:
    from reliability_toys import ReliabilityToyModel
    torch.save({'state_dict': ReliabilityToyModel().state_dict()}, str(path))
    return str(path)


def test_out_json_folder_gets_test_metrics_json(tmp_path):
    """``--out-json DIR`` failed with IsADirectoryError, after the whole evaluation."""
    cfg = toy_config(tmp_path / 'toy.py', extra=TOY_TEST)
    ckpt = _untrained_toy_checkpoint(tmp_path / 'toy.pth')
    test = load_tool('test')
    folder = tmp_path / 'results'
    folder.mkdir()
    metrics = test.main([cfg, ckpt, '--work-dir', str(tmp_path / 'w'), '--out-json', str(folder)])
    with open(folder / 'test_metrics.json') as f:
        assert json.load(f)['metrics'] == pytest.approx(metrics)
    # a folder still to be made, written as one (a trailing separator)
    test.main([cfg, ckpt, '--work-dir', str(tmp_path / 'w'), '--out-json',
               str(tmp_path / 'new') + os.sep])
    assert osp.isfile(tmp_path / 'new' / 'test_metrics.json')


@pytest.mark.e2e
@pytest.mark.parametrize('tier', ['generated', pytest.param('real', marks=pytest.mark.slow)])
def test_show_dir_draws_every_classification_test_image(tmp_path, sample_data, tier):
    """``tools/test.py --show-dir`` with an mmpretrain config draws each test image once: its
    VisualizationHook draws one sample in ``interval`` (5000 by default), so only the first
    image was drawn."""
    root = sample_data('imagenet', tier)
    cfg = tmp_path / 'cfg.py'
    base = osp.join(ROOT, 'configs', 'weightformer', 'weightformer-t_8xb256_in1k.py')
    cfg.write_text(f'''_base_ = {base!r}
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(64, 64)),
                 dict(type='PackInputs')]
test_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={root!r}, split='val', indices=5, pipeline=test_pipeline))
''')
    # what is drawn does not depend on the weights: an untrained classifier, saved whole (the
    # tool refuses a checkpoint that leaves parameters unloaded)
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    ckpt = str(tmp_path / 'untrained.pth')
    model = MODELS.build(Config.fromfile(str(cfg)).model)
    torch.save({'state_dict': model.state_dict()}, ckpt)
    vis = tmp_path / 'vis'
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'test.py'), str(cfg), ckpt,
                           '--work-dir', str(tmp_path / 'work'), '--show-dir', str(vis)],
                          cwd=ROOT, env=tool_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(osp.join(root, 'meta', 'val.txt')) as f:
        first5 = [line.split()[0] for line in f][:5]
    # 5 images in batches of 2: the batches after the first are drawn too, the last one short
    assert sorted(p.name for p in vis.rglob('*.png')) == sorted(f'{n}_0.png' for n in first5)


@pytest.mark.parametrize('tool', ['train', 'test'])
@pytest.mark.parametrize('launcher', ['slurm', 'mpi'])
def test_gpu_launcher_on_a_cpu_names_it(tmp_path, monkeypatch, tool, launcher):
    """``--launcher slurm`` on a CPU-only machine said "--launcher pytorch needs the torchrun
    environment"."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    for key in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv('LOCAL_RANK', '0')  # (the tools set it; restored after the test)
    cfg = toy_config(tmp_path / 'toy.py', extra=TOY_TEST)
    args = [cfg] + ([_untrained_toy_checkpoint(tmp_path / 'toy.pth')] if tool == 'test' else [])
    with pytest.raises(RuntimeError, match=f'^--launcher {launcher} needs a CUDA GPU .* '
                                           f'--launcher pytorch under torchrun'):
        load_tool(tool).main(args + ['--work-dir', str(tmp_path / 'w'), '--launcher', launcher])


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
