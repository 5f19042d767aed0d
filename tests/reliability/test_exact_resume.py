"""Exact resume: a run killed with SIGKILL after a checkpoint and resumed with ``--resume`` ends
bit for bit where the uninterrupted run ends (weights, optimizer state, logged losses).

The toy run has every random stream of a real one: dropout in the model (main-process torch
stream) and numpy / Python / torch draws in the data pipeline, which run in the main process with
``num_workers=0`` and in worker processes with ``num_workers=2``. Validation runs between the
checkpoint and the next training step, as in real configs.
"""
import copy
import itertools
import os.path as osp

import pytest

from mmeffattn.analysis.logs import load_log
from reliability_toys import (assert_states_equal, checkpoint_state, load_tool, logged_losses,
                              run_train_subprocess, toy_config)

pytestmark = pytest.mark.usefixtures('one_thread')
_RUNS = itertools.count()


def _train(*argv) -> None:
    """tools/train.py in this process. Each run gets its own experiment name: mmengine names its
    process-wide MessageHub after it (by default a timestamp, shared by runs in the same second),
    and a shared hub would mix the loss histories that the tests compare."""
    argv = list(argv)
    name = f'experiment_name=run{next(_RUNS)}'
    if '--cfg-options' in argv:
        argv.insert(argv.index('--cfg-options') + 1, name)
    else:
        argv += ['--cfg-options', name]
    load_tool('train').main(argv)


def _kill_resume_and_compare(tmp_path, by_epoch: bool, num_workers: int) -> None:
    steps, interval = (3, 1) if by_epoch else (6, 3)
    common = dict(by_epoch=by_epoch, max_steps=steps, interval=interval, num_workers=num_workers,
                  val=True)
    plain = toy_config(tmp_path / 'plain.py', **common)
    kill = 'at_epoch=1' if by_epoch else f'at_iter={interval}'
    killed_cfg = toy_config(tmp_path / 'killed.py', **common, extra=(
        f"custom_hooks = [dict(type='SigkillAfterCheckpointHook', {kill})]\n"))
    ref, work = str(tmp_path / 'ref'), str(tmp_path / 'work')

    _train(plain, '--work-dir', ref)
    proc = run_train_subprocess([killed_cfg, '--work-dir', work])
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-3000:]
    first = 'epoch_1.pth' if by_epoch else f'iter_{interval}.pth'
    assert osp.isfile(osp.join(work, first)), 'the killed run wrote no checkpoint'
    _train(killed_cfg, '--work-dir', work, '--resume')

    last = f'epoch_{steps}.pth' if by_epoch else f'iter_{steps}.pth'
    assert_states_equal(checkpoint_state(osp.join(ref, last)),
                        checkpoint_state(osp.join(work, last)))
    ref_losses, losses = logged_losses(osp.join(ref, last)), logged_losses(osp.join(work, last))
    assert len(ref_losses) == len(losses) > 0 and ref_losses == losses
    # the work dir's two runs read as one history (tools/analysis_tools/analyze_logs.py) give
    # the uninterrupted run's curves
    ref_log, log = load_log(ref), load_log(work)
    assert log.series('loss') == ref_log.series('loss')

    def metrics(line: dict) -> dict:  # the metrics and their step, not the timings
        return {k: v for k, v in line.items() if 'time' not in k}

    # the killed run died before validating after its checkpoint; the last validation agrees
    assert metrics(log.val[-1]) == metrics(ref_log.val[-1])


def test_iteration_resume_after_sigkill_is_exact(tmp_path):
    _kill_resume_and_compare(tmp_path, by_epoch=False, num_workers=0)


@pytest.mark.slow
@pytest.mark.parametrize('by_epoch,num_workers', [(False, 2), (True, 0), (True, 2)],
                         ids=['iter-workers2', 'epoch-workers0', 'epoch-workers2'])
def test_resume_after_sigkill_is_exact_slow(tmp_path, by_epoch, num_workers):
    _kill_resume_and_compare(tmp_path, by_epoch=by_epoch, num_workers=num_workers)


def test_epoch_resume_is_exact(tmp_path):
    """In-process (no kill): stop after epoch 1, resume to epoch 3; the same as 3 epochs."""
    cfg = toy_config(tmp_path / 'cfg.py', by_epoch=True, max_steps=3, interval=1, val=True)
    ref, work = str(tmp_path / 'ref'), str(tmp_path / 'work')
    _train(cfg, '--work-dir', ref)
    _train(cfg, '--work-dir', work, '--cfg-options', 'train_cfg.max_epochs=1')
    _train(cfg, '--work-dir', work, '--resume')
    assert_states_equal(checkpoint_state(osp.join(ref, 'epoch_3.pth')),
                        checkpoint_state(osp.join(work, 'epoch_3.pth')))
    assert logged_losses(osp.join(ref, 'epoch_3.pth')) == logged_losses(osp.join(work,
                                                                                'epoch_3.pth'))


def test_persistent_workers_in_epoch_loop_warn(tmp_path, capsys):
    """Persistent workers keep their streams across epochs; no checkpoint holds them, so the
    resume says that it is not bit for bit."""
    cfg = toy_config(tmp_path / 'cfg.py', by_epoch=True, max_steps=2, interval=1, num_workers=2,
                     persistent=True)
    work = str(tmp_path / 'work')
    _train(cfg, '--work-dir', work, '--cfg-options', 'train_cfg.max_epochs=1')
    capsys.readouterr()
    _train(cfg, '--work-dir', work, '--resume')
    out = capsys.readouterr()
    assert 'persistent_workers=False' in out.out + out.err


def test_checkpoint_carries_rng_state_and_position(tmp_path):
    from mmeffattn.engine import load_checkpoint_file
    cfg = toy_config(tmp_path / 'cfg.py', max_steps=2, interval=2)
    _train(cfg, '--work-dir', str(tmp_path))
    ckpt = load_checkpoint_file(str(tmp_path / 'iter_2.pth'))
    state = ckpt['rng_state']
    assert {'python', 'numpy', 'torch', 'position'} <= set(state)
    assert state['position']['iter'] == 2 and state['position']['seed'] == 0


def test_resume_takes_the_seed_from_the_checkpoint(tmp_path):
    """A config with ``randomness.seed=None`` resumes with the checkpoint's seed, so the data
    loader (sampler, worker seeds) is rebuilt as in the interrupted run."""
    from mmengine.config import Config

    from mmeffattn.engine.runner_setup import configure_resume
    cfg_path = toy_config(tmp_path / 'cfg.py', max_steps=2, interval=2, seed=1234)
    _train(cfg_path, '--work-dir', str(tmp_path))
    cfg = Config.fromfile(toy_config(tmp_path / 'cfg2.py', max_steps=4, seed=None))
    cfg.work_dir = str(tmp_path)
    configure_resume(cfg, 'auto')
    assert cfg.resume and cfg.load_from.endswith('iter_2.pth')
    assert cfg.randomness.seed == 1234


def test_hook_from_a_stock_config(tmp_path):
    """A config run by another tool (here: mmengine's Runner directly) gets exact resume by
    adding the hook after ``custom_imports``."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    extra = ("custom_imports = dict(imports=['reliability_toys', 'mmeffattn'])\n"
             "custom_hooks = [dict(type='ExactResumeHook')]\n")
    cfg = Config.fromfile(toy_config(tmp_path / 'cfg.py', max_steps=4, interval=2, extra=extra))
    cfg.work_dir = str(tmp_path / 'ref')
    Runner.from_cfg(copy.deepcopy(cfg)).train()
    cfg.work_dir = str(tmp_path / 'work')
    half = copy.deepcopy(cfg)
    half.train_cfg.max_iters = 2
    Runner.from_cfg(half).train()
    cfg.resume = True
    Runner.from_cfg(cfg).train()
    assert_states_equal(checkpoint_state(str(tmp_path / 'ref' / 'iter_4.pth')),
                        checkpoint_state(str(tmp_path / 'work' / 'iter_4.pth')))
