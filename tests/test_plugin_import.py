"""``import mmeffattn`` registers modules and changes nothing else; ``import mmeffattn.ops`` needs
only torch (and Triton). Each check runs in a fresh interpreter, since the test process may have
switched the opt-in (:mod:`mmeffattn.engine.patch_mmengine`) on already."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])

# What mmengine and torch look like: each function and scheme by identity, the config-package
# table and torch's process-wide weights_only allow-list.
_SNAPSHOT = '''
import json, sys, torch
import torch._dynamo  # (its import allow-lists a torch class of its own)
from mmengine.config import config as cfg_module, utils as cfg_utils
from mmengine.runner import checkpoint as mm_ckpt, runner as mm_runner

def snapshot():
    return dict(
        save_checkpoint=id(mm_runner.save_checkpoint),
        schemes={k: id(v) for k, v in mm_ckpt.CheckpointLoader._schemes.items()},
        get_installed_path=id(cfg_module.get_installed_path),
        MODULE2PACKAGE=dict(cfg_utils.MODULE2PACKAGE),
        safe_globals=sorted(map(str, torch.serialization.get_safe_globals())))

def diff(a, b):
    return sorted(k for k in a if a[k] != b[k])

before = snapshot()
import mmeffattn
import mmeffattn.models, mmeffattn.engine, mmeffattn.registry  # everything it registers
plain = snapshot()
import mmeffattn.engine.patch_mmengine
opted_in = snapshot()
print('RESULT', json.dumps(dict(plain=diff(before, plain), opt_in=diff(plain, opted_in))))
'''


def _run(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def _result(proc: subprocess.CompletedProcess) -> dict:
    line = next((x for x in proc.stdout.splitlines() if x.startswith('RESULT ')), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len('RESULT '):])


def test_import_leaves_mmengine_and_torch_as_they_were():
    result = _result(_run(_SNAPSHOT))
    assert result['plain'] == [], f'import mmeffattn changed mmengine/torch: {result["plain"]}'
    # the control: the snapshot sees the patches, so that an unchanged one means something
    assert result['opt_in'] == ['MODULE2PACKAGE', 'get_installed_path', 'save_checkpoint',
                                'schemes'], result['opt_in']


# Hides the OpenMMLab stack from the interpreter, as on a machine with only torch and triton:
# ``None`` in sys.modules makes ``import mmengine`` raise ModuleNotFoundError and
# ``importlib.util.find_spec('mmengine')`` answer None; the finder stops any submodule.
_HIDE = '''
import importlib.abc, sys
HIDDEN = ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain')

class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in HIDDEN:
            raise ModuleNotFoundError(f'{name} is hidden by the test', name=name)
        return None

sys.meta_path.insert(0, _Hide())
for name in HIDDEN:
    sys.modules[name] = None
'''

_OPS_ALONE = '''
import sys, torch
import importlib.util
assert importlib.util.find_spec('mmengine') is None, 'mmengine is not hidden'
try:
    import mmengine
except ImportError:
    pass
else:
    raise AssertionError('mmengine is not hidden')
import mmeffattn.ops as ops
x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
y = torch.randn(1, 2, 3, 8, dtype=torch.float64)
out = ops.laplacian_kernel(x, y, 2.0, backend='reference')
ref = torch.exp(-(x[:, :, :, None] - y[:, :, None]).abs().sum(-1) / 2.0)
torch.testing.assert_close(out, ref)
q, k, v = (torch.randn(1, 2, 12, 16) for _ in range(3))
print('SEMA', tuple(ops.sema_attention(q, k, v, (3, 4), 2).shape))
import mmeffattn
loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split('.')[0] in
                ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain'))
print('RESULT', {'openmmlab_modules': loaded, 'has_models': hasattr(mmeffattn, 'models')})
try:  # the control: what needs mmengine does fail here
    import mmeffattn.models
except ModuleNotFoundError as e:
    print('HIDDEN', e.name)
'''


def test_ops_import_and_run_with_torch_alone(tmp_path):
    (tmp_path / 'sitecustomize.py').write_text(textwrap.dedent(_HIDE))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]),
               OMP_NUM_THREADS='1')
    proc = _run(_OPS_ALONE, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert 'SEMA (1, 2, 12, 16)' in proc.stdout, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith('RESULT '))
    assert line == "RESULT {'openmmlab_modules': [], 'has_models': False}", line
    assert 'HIDDEN mm' in proc.stdout, proc.stdout
