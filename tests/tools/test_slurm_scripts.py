"""tools/slurm_{train,test}.sh build the OpenMMLab srun command (checked with a stand-in srun)."""
import os
import os.path as osp
import subprocess

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture
def fake_srun(tmp_path):
    """A ``srun`` on PATH that prints its arguments, one per line, instead of launching."""
    srun = tmp_path / 'bin' / 'srun'
    srun.parent.mkdir()
    srun.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    srun.chmod(0o755)
    return dict(os.environ, PATH=f'{srun.parent}:{os.environ["PATH"]}')


@pytest.mark.parametrize('script,tool,fourth', [('slurm_train.sh', 'train.py', 'work_dirs/x'),
                                                ('slurm_test.sh', 'test.py', 'ckpt.pth')])
def test_srun_command(fake_srun, script, tool, fourth):
    env = dict(fake_srun, GPUS='16', GPUS_PER_NODE='8', CPUS_PER_TASK='4',
               SRUN_ARGS='--quotatype=auto --time=10')
    out = subprocess.run(['bash', osp.join(ROOT, 'tools', script), 'part', 'job', 'cfg.py',
                          fourth, '--cfg-options', 'a=1'], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[:2] == ['-p', 'part'] and '--job-name=job' in out
    for arg in ('--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8', '--cpus-per-task=4',
                '--quotatype=auto', '--time=10'):
        assert arg in out, (arg, out)
    i = out.index(osp.join(ROOT, 'tools', tool))
    assert out[i + 1] == 'cfg.py' and '--launcher' in out[i:] and 'slurm' in out[i:]
    assert out[-2:] == ['--cfg-options', 'a=1']
    assert (f'--work-dir={fourth}' in out) == (tool == 'train.py')
    assert (fourth in out) == (tool == 'test.py')


@pytest.mark.parametrize('script', ['slurm_train.sh', 'slurm_test.sh'])
def test_missing_arguments_print_usage(fake_srun, script):
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', script), 'part'], env=fake_srun,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and 'usage:' in proc.stderr
