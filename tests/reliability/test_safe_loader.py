"""The safe loader is scoped: neither ``import mmeffattn`` nor the opt-in
``mmeffattn.engine.patch_mmengine`` adds anything to torch's process-wide ``weights_only``
allow-list; mmengine checkpoints load only inside the loaders that need them;
the ``getattr`` they contain is a stand-in that cannot be used to reach ``os.system``."""
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch

from reliability_toys import ROOT, load_tool, tool_env, toy_config


def test_import_adds_no_process_wide_safe_globals():
    code = ('import torch\n'
            'before = set(map(str, torch.serialization.get_safe_globals()))\n'
            'import mmeffattn, mmeffattn.engine.patch_mmengine\n'
            'after = set(map(str, torch.serialization.get_safe_globals()))\n'
            '# torch.distributed.tensor (imported by mmengine) allow-lists its own classes\n'
            'print("ADDED", sorted(a for a in after - before if "torch." not in a))\n')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=tool_env(),
                         capture_output=True, text=True, timeout=300)
    assert 'ADDED []' in out.stdout, out.stdout + out.stderr[-3000:]


@pytest.fixture(scope='module')
def runner_checkpoint(tmp_path_factory):
    work = tmp_path_factory.mktemp('ckpt')
    load_tool('train').main([toy_config(work / 'cfg.py', max_steps=2, interval=2),
                             '--work-dir', str(work)])
    return str(work / 'iter_2.pth')


def test_runner_checkpoint_loads_only_in_scope(runner_checkpoint):
    from mmengine.logging import HistoryBuffer

    from mmeffattn.engine import load_checkpoint_file, mmengine_safe_loading
    with pytest.raises(pickle.UnpicklingError):  # plain torch.load: still refused
        torch.load(runner_checkpoint, weights_only=True)
    ckpt = load_checkpoint_file(runner_checkpoint)
    assert isinstance(ckpt['message_hub']['log_scalars']['train/loss'], HistoryBuffer)
    with mmengine_safe_loading():
        torch.load(runner_checkpoint, weights_only=True)
    with pytest.raises(pickle.UnpicklingError):  # the scope has ended
        torch.load(runner_checkpoint, weights_only=True)
    allowed = set(map(str, torch.serialization.get_safe_globals()))
    assert not any('HistoryBuffer' in a or 'getattr' in a for a in allowed), allowed


class _Call:
    """Pickles as ``fn(*args)``: the building block of a malicious pickle."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args

    def __call__(self):  # pickle insists that the reduce target looks callable
        raise AssertionError


def _payloads(marker: str):
    """Two crafted files that use only ``getattr`` and objects the loader allows:

    * ``run``: getattr(getattr.__self__, '__import__')('os').system('touch MARKER');
    * ``reach``: {'x': getattr(getattr.__self__, 'eval')} - hands ``eval`` to the program (or,
      with SETITEM, could plant it in any reachable dict).
    """
    builtins_mod = _Call(getattr, getattr, '__self__')
    import_ = _Call(getattr, builtins_mod, '__import__')
    os_mod = _Call(import_, 'os')
    run = {'state_dict': {}, 'x': _Call(_Call(getattr, os_mod, 'system'), f'touch {marker}')}
    reach = {'state_dict': {}, 'x': _Call(getattr, builtins_mod, 'eval')}
    return run, reach


def test_crafted_getattr_pickle_cannot_reach_os_system(tmp_path):
    from mmengine.logging import HistoryBuffer
    from mmengine.runner import CheckpointLoader

    import mmeffattn.engine.patch_mmengine  # noqa: F401  (the Runner's loader, as our tools set it)

    from mmeffattn.engine import CheckpointError, load_checkpoint_file
    marker = tmp_path / 'pwned'
    run, reach = _payloads(str(marker))
    run_path, reach_path = str(tmp_path / 'run.pth'), str(tmp_path / 'reach.pth')
    torch.save(run, run_path)
    torch.save(reach, reach_path)

    for path in (run_path, reach_path):
        with pytest.raises(CheckpointError, match=osp.basename(path)):
            load_checkpoint_file(path)
        with pytest.raises(CheckpointError):  # the Runner's / Pretrained's path
            CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert not marker.exists()

    # The control: with the real getattr allowed (what main did for the whole process) the
    # files get through getattr - to builtins.eval, and to __import__ (stopped there only by
    # torch's own refusal to call an unlisted function). The stand-in stops both at once.
    with torch.serialization.safe_globals([getattr, HistoryBuffer]):
        assert torch.load(reach_path, weights_only=True)['x'] is eval
        with pytest.raises(pickle.UnpicklingError, match='__import__'):
            torch.load(run_path, weights_only=True)
    assert not marker.exists()
