"""Atomic checkpoints: a kill in the middle of a save leaves the old file or the new one under the
final name, never a truncated file - for the Runner's saves and the converters' saves."""
import os
import os.path as osp
import subprocess
import sys
import time

import pytest
import torch

from reliability_toys import ROOT, tool_env

# The child saves a small checkpoint completely, then a large one to the same name, through the
# function mmengine's Runner.save_checkpoint calls (made atomic by `import mmeffattn`).
_CHILD = r'''
import sys, torch
import mmeffattn  # noqa: F401
from mmengine.runner import runner
path = sys.argv[1]
runner.save_checkpoint({'state_dict': {'w': torch.ones(4)}}, path)
print('first saved', flush=True)
runner.save_checkpoint({'state_dict': {'w': torch.zeros(64 * 1024 * 1024)}}, path)
print('second saved', flush=True)
'''


def _folder_state(folder):
    return sorted((n, os.stat(osp.join(folder, n)).st_size) for n in os.listdir(folder))


def test_sigkill_during_runner_save_leaves_old_or_new_file(tmp_path):
    path = str(tmp_path / 'iter_2.pth')
    proc = subprocess.Popen([sys.executable, '-c', _CHILD, path], cwd=ROOT, env=tool_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or 'first saved' not in lines[-1]:  # (mmengine may log to stdout too)
            lines.append(proc.stdout.readline())
            assert lines[-1], ''.join(lines) + proc.stderr.read()[-3000:]
        before = _folder_state(tmp_path)
        deadline = time.time() + 60
        while _folder_state(tmp_path) == before and proc.poll() is None:  # the save has begun
            assert time.time() < deadline, 'the second save never started'
            time.sleep(0.002)
        proc.kill()  # SIGKILL in the middle of writing 256 MB
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -9, 'the save finished before the kill: make it larger'
    state = torch.load(path, weights_only=True)['state_dict']  # never truncated
    assert state['w'].numel() in (4, 64 * 1024 * 1024)
    leftovers = [n for n in os.listdir(tmp_path) if n != 'iter_2.pth']
    assert all(n.startswith('.iter_2.pth.') and n.endswith('.tmp') for n in leftovers), leftovers


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError('cannot pickle this')


def test_failed_save_keeps_the_old_file_and_no_temp(tmp_path):
    from mmeffattn.engine import atomic_save
    path = str(tmp_path / 'ckpt.pth')
    atomic_save({'w': torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match='cannot pickle'):
        atomic_save({'w': torch.zeros(1000), 'bad': _FailsToPickle()}, path)
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(3))
    assert os.listdir(tmp_path) == ['ckpt.pth']
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())  # as a plain open()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_converter_save_is_atomic(tmp_path):
    """tools/model_converters/converter_cli.save_converted: a failing save keeps the old file."""
    sys.path.insert(0, osp.join(ROOT, 'tools', 'model_converters'))
    try:
        from converter_cli import save_converted
    finally:
        sys.path.pop(0)
    dst = str(tmp_path / 'converted.pth')
    save_converted({'w': torch.ones(2)}, {'src': 'a'}, dst)
    with pytest.raises(RuntimeError, match='cannot pickle'):
        save_converted({'w': torch.zeros(2), 'bad': _FailsToPickle()}, {'src': 'b'}, dst)
    saved = torch.load(dst, weights_only=True)
    assert saved['meta'] == {'src': 'a'} and torch.equal(saved['state_dict']['w'], torch.ones(2))
    assert os.listdir(tmp_path) == ['converted.pth']


def test_runner_save_is_patched_on_import():
    """``import mmeffattn`` (what custom_imports does) makes the Runner's save atomic."""
    import mmeffattn  # noqa: F401
    from mmengine.runner import runner
    assert getattr(runner.save_checkpoint, '_mmeffattn_atomic', False)
