"""Atomic checkpoints: a kill in the middle of a save leaves the old file or the new one under the
final name, never a truncated file - for the Runner's saves and the converters' saves. The partial
temporary file the kill leaves is never resumed from, and the next save (or --resume) removes it."""
import os
import os.path as osp
import subprocess
import sys
import time

import pytest
import torch

from reliability_toys import ROOT, tool_env

# The child saves a small checkpoint completely, then a large one to the same name, through the
# function mmengine's Runner.save_checkpoint calls (made atomic by the opt-in import).
_CHILD = r'''
import sys, torch
import mmeffattn.engine.patch_mmengine  # noqa: F401
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
    """mmeffattn.models.converters.save_converted: a failing save keeps the old file."""
    from mmeffattn.models.converters import save_converted
    dst = str(tmp_path / 'converted.pth')
    save_converted({'w': torch.ones(2)}, {'src': 'a'}, dst)
    with pytest.raises(RuntimeError, match='cannot pickle'):
        save_converted({'w': torch.zeros(2), 'bad': _FailsToPickle()}, {'src': 'b'}, dst)
    saved = torch.load(dst, weights_only=True)
    assert saved['meta'] == {'src': 'a'} and torch.equal(saved['state_dict']['w'], torch.ones(2))
    assert os.listdir(tmp_path) == ['converted.pth']


def test_runner_save_is_atomic_only_after_the_opt_in():
    """``import mmeffattn`` leaves the Runner's save alone; the opt-in import (a config's
    ``custom_imports``) and our tools' ``prepare_runtime`` make it atomic (in a fresh process)."""
    code = ('from mmengine.runner import runner\n'
            'import mmeffattn\n'
            'print("PLAIN", getattr(runner.save_checkpoint, "_mmeffattn_atomic", False))\n'
            'import mmeffattn.engine.patch_mmengine\n'
            'print("OPT-IN", getattr(runner.save_checkpoint, "_mmeffattn_atomic", False))\n')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=tool_env(),
                         capture_output=True, text=True, timeout=300)
    assert 'PLAIN False' in out.stdout and 'OPT-IN True' in out.stdout, \
        out.stdout + out.stderr[-3000:]


# The child dies (SIGKILL, which no ``except`` sees) in the middle of an atomic save, leaving the
# partial temporary file under the name the writer really gives it.
_KILLED_SAVE = r'''
import os, signal, sys
from mmeffattn.engine import atomic_write

def write(f):
    f.write(b'x' * 4096)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

atomic_write(sys.argv[1], write)
'''

# Names that only look like a leftover of a save to iter_2.pth: another target's, not hidden,
# another suffix, a random part of another length, one mkstemp never makes (upper case).
_LOOKALIKES = ['.iter_20.pth.abcd1234.tmp', 'iter_2.pth.abcd1234.tmp',
               '.iter_2.pth.abcd1234.tmp.bak', '.iter_2.pth.notes.tmp', '.iter_2.pth.ABCD1234.tmp']


def test_next_save_removes_what_a_killed_save_left(tmp_path):
    """A kill in the middle of writing left a hidden, checkpoint-sized ``.iter_2.pth.*.tmp``
    beside the checkpoint forever; the next save to that name removes it, and nothing else."""
    path = str(tmp_path / 'iter_2.pth')
    proc = subprocess.run([sys.executable, '-c', _KILLED_SAVE, path], cwd=ROOT, env=tool_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    (leftover, ) = os.listdir(tmp_path)
    assert leftover.startswith('.iter_2.pth.') and leftover.endswith('.tmp'), leftover
    for name in _LOOKALIKES:
        (tmp_path / name).write_bytes(b'not ours')

    from mmeffattn.engine import atomic_save
    atomic_save({'w': torch.ones(2)}, path)
    assert sorted(os.listdir(tmp_path)) == sorted(['iter_2.pth', *_LOOKALIKES])
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(2))


def test_resume_never_takes_a_leftover_and_removes_it(tmp_path, capsys):
    """A leftover is never resumed from, even a complete checkpoint newer than every ``*.pth``
    (killed between the write and the rename); ``--resume`` removes the leftovers of the run."""
    import tempfile

    from mmeffattn.engine import find_resume_checkpoint
    torch.save({'meta': {'iter': 1}}, str(tmp_path / 'iter_1.pth'))
    os.utime(tmp_path / 'iter_1.pth', (1, 1))
    fd, leftover = tempfile.mkstemp(prefix='.iter_2.pth.', suffix='.tmp', dir=str(tmp_path))
    with os.fdopen(fd, 'wb') as f:  # the name atomic_write gives, with a whole checkpoint in it
        torch.save({'meta': {'iter': 2}}, f)
    (tmp_path / '.keep.txt.abcd1234.tmp').write_bytes(b'a save, but not of a checkpoint')

    assert find_resume_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_1.pth')
    assert sorted(os.listdir(tmp_path)) == ['.keep.txt.abcd1234.tmp', 'iter_1.pth']
    assert osp.basename(leftover) in capsys.readouterr().out  # said what it removed

    os.remove(tmp_path / 'iter_1.pth')
    fd, _ = tempfile.mkstemp(prefix='.iter_2.pth.', suffix='.tmp', dir=str(tmp_path))
    os.close(fd)
    assert find_resume_checkpoint(str(tmp_path)) is None  # only a leftover: nothing to resume
    assert os.listdir(tmp_path) == ['.keep.txt.abcd1234.tmp']
