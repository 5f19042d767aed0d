"""The main job's pipeline, end to end at a tiny size: data generation, train (the loss falls
below the same batches' at learning rate 0), test (the mAP it reports is pycocotools' on the
detections it wrote), pictures; and its work dir: the same command, killed, resumes; other
settings start fresh beside it."""
import glob
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
from e2e_helpers import (ROOT, assert_loss_falls, learning_config, pycocotools_map, run_tool,
                         train_losses)

pytestmark = pytest.mark.e2e


# The demo config with a constant learning rate (its 50-step warm-up starts at 1/100) and every
# iteration logged, so that one epoch of 2 batches shows the loss falling (measured: 17% below
# the same batches at learning rate 0); the evaluation writes its detections. AP after an update
# from scratch is about 0 trained or not: the main job itself shows what the model reaches.
LEARNING_DEMO = '''
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True, begin=0, end=1)]
default_hooks = dict(logger=dict(interval=1))
test_evaluator = dict(outfile_prefix={dets!r})
'''
DEMO = 'configs/demo/mask-rcnn_sema-t_fpn_shapes.py'


def test_demo_smoke(tmp_path):
    work, data, dets = tmp_path / 'work', tmp_path / 'shapes', str(tmp_path / 'dets')
    body = LEARNING_DEMO.format(dets=dets)
    cfg = learning_config(tmp_path / 'demo_cfg.py', DEMO, body)
    proc = run_tool(['tools/demo.py', '--config', cfg, '--work-dir', str(work), '--data-root',
                     str(data), '--epochs', '1', '--num-train', '8', '--num-val', '4',
                     '--num-draw', '2'], timeout=900)
    out = proc.stdout
    # the reported mAP is that of the detections the evaluation wrote, by pycocotools alone
    metrics = json.load(open(work / 'metrics.json'))['metrics']
    for iou_type in ('bbox', 'segm'):
        expected = pycocotools_map(str(data / 'annotations' / 'instances_val2017.json'),
                                   f'{dets}.{iou_type}.json', iou_type)
        assert metrics[f'coco/{iou_type}_mAP'] == pytest.approx(expected, abs=5e-4)
    assert (work / 'epoch_1.pth').is_file()
    # it learns: the training command the demo ran, with the config at learning rate 0, ends
    # higher on the same batches
    [train_cmd] = [line[2:].split() for line in out.splitlines()
                   if line.startswith('$ ') and 'tools/train.py' in line]
    work0 = str(tmp_path / 'work_lr0')
    options = train_cmd[train_cmd.index('--cfg-options') + 1:]
    run_tool(['tools/train.py', learning_config(tmp_path / 'demo_cfg0.py', DEMO, body, lr0=True),
              '--work-dir', work0, '--cfg-options', *options, 'val_cfg=None',
              'val_dataloader=None', 'val_evaluator=None'], timeout=900)
    assert_loss_falls(train_losses(str(work)), train_losses(work0), drop=0.05)
    pics = sorted((work / 'predictions').glob('*.png'))
    assert len(pics) == 2
    # the summary names every artifact, and they exist
    for line in ('checkpoint:', 'training log:', 'metrics JSON:', 'predictions drawn:'):
        assert line in out, out[-3000:]
    log = out.split('training log: ')[1].split()[0]
    assert osp.isfile(log)
    # what the run was started with, for the next run to compare
    settings = json.load(open(work / 'demo_run.json'))['settings']
    assert settings['dataset']['num_train'] == 8 and settings['epochs'] == 1
    assert f'work dir: {work}: a new run' in out


def _kill_after_first_checkpoint(cmd, work_dir: str, timeout: int = 900) -> None:
    """Run ``cmd`` (tools/demo.py and the tools/train.py it starts) and SIGKILL them all once
    the work dir's last_checkpoint names epoch_1.pth (a checkpoint is written whole first)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env.pop('TRITON_INTERPRET', None)
    record, deadline = osp.join(work_dir, 'last_checkpoint'), time.time() + timeout
    proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (osp.isfile(record) and open(record).read().endswith('epoch_1.pth')):
            assert proc.poll() is None, f'{cmd} ended ({proc.returncode}) before epoch_1.pth'
            assert time.time() < deadline, f'{cmd}: no epoch_1.pth in {timeout} s'
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow  # three small trainings: ~5 minutes on 2 busy cores
def test_demo_killed_run_resumes_other_settings_start_fresh(tmp_path):
    work, data = str(tmp_path / 'work'), str(tmp_path / 'shapes')
    cmd = ['tools/demo.py', '--work-dir', work, '--data-root', data, '--epochs', '2',
           '--num-train', '8', '--num-val', '4', '--num-draw', '1']
    _kill_after_first_checkpoint(cmd, work)
    assert not osp.isfile(osp.join(work, 'epoch_2.pth'))

    # the same command goes on from the killed run's checkpoint
    proc = run_tool(cmd, timeout=900)
    out = proc.stdout + proc.stderr
    assert 'resuming it from its last checkpoint' in out, out[-3000:]
    assert f'--resume: resuming from {osp.join(work, "epoch_1.pth")}' in out, out[-3000:]
    assert 'Epoch(train) [1]' not in out and 'Epoch(train) [2]' in out
    assert glob.glob(work + '.old-*') == []

    # another dataset size: the finished run is moved aside whole, the new one starts fresh
    proc = run_tool(['tools/demo.py', '--work-dir', work, '--data-root', data, '--epochs', '1',
                     '--num-train', '12', '--num-val', '4', '--num-draw', '1'], timeout=900)
    out = proc.stdout + proc.stderr
    [old] = glob.glob(work + '.old-*')
    assert 'dataset.num_train 8 -> 12' in out and 'epochs 2 -> 1' in out and old in out
    assert 'no checkpoint to resume from' in out, out[-3000:]
    assert osp.isfile(osp.join(old, 'epoch_2.pth')) and osp.isfile(osp.join(old, 'metrics.json'))
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    assert not osp.isfile(osp.join(work, 'epoch_2.pth'))
