"""Two gloo processes (tools/dist_train.sh on the CPU) end with identical parameters, and the
checkpoint they write resumes."""
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch

from reliability_toys import ROOT, tool_env, toy_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_end_identical(tmp_path):
    cfg = toy_config(tmp_path / 'cfg.py', max_steps=4, interval=2, num_workers=0, extra=(
        "custom_hooks = [dict(type='DumpRankStateHook')]\n"))
    work = str(tmp_path / 'work')
    env = tool_env(PYTHON=sys.executable, PORT=str(_free_port()))
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'dist_train.sh'), cfg, '2',
                           '--work-dir', work], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (torch.load(osp.join(work, f'rank{r}.pt'), weights_only=True) for r in (0, 1))
    assert r0.keys() == r1.keys() and all(torch.equal(r0[k], r1[k]) for k in r0)
    from mmeffattn.engine import load_checkpoint_file
    saved = load_checkpoint_file(osp.join(work, 'iter_4.pth'))['state_dict']
    assert all(torch.equal(saved[k], r0[k]) for k in r0)
