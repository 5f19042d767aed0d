"""The documented one-line opt-in, with mmdet's own ``tools/train.py`` (shipped in the installed
mmdet under ``.mim/tools``): a config whose ``custom_imports`` lists
``mmeffattn.engine.patch_mmengine`` resumes an mmengine checkpoint under torch's weights-only
loader; with ``custom_imports=['mmeffattn']`` alone, mmengine is untouched and torch refuses the
same resume (the control). ``load_from`` goes through the same loader
(tests/engine/test_checkpoint_compat.py)."""
import os
import os.path as osp
import subprocess
import sys

from e2e_helpers import stock_train_py
from reliability_toys import tool_env, toy_config

OPT_IN = ("custom_imports = dict(imports=['reliability_toys', 'mmeffattn', "
          "'mmeffattn.engine.patch_mmengine'], allow_failed_imports=False)\n")
PLAIN = ("custom_imports = dict(imports=['reliability_toys', 'mmeffattn'], "
         "allow_failed_imports=False)\n")


def _train(cfg: str, work: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, stock_train_py('mmdet'), cfg, '--work-dir', work,
                           *args],
                          cwd=str(work), env=tool_env(), capture_output=True, text=True,
                          timeout=600)


def _config(path, custom_imports: str, max_steps: int) -> str:
    return toy_config(path, max_steps=max_steps, interval=2, extra=custom_imports)


def test_mmdet_train_resumes_with_the_one_line_opt_in(tmp_path):
    work = str(tmp_path / 'work')
    os.makedirs(work)
    first = _train(_config(tmp_path / 'a.py', OPT_IN, 2), work)
    assert first.returncode == 0 and osp.isfile(osp.join(work, 'iter_2.pth')), \
        first.stdout[-2000:] + first.stderr[-3000:]

    # the control: the same resume with only custom_imports=['mmeffattn'] is refused by torch's
    # weights-only loader (mmengine's message hub in the checkpoint), so the opt-in is what works
    plain = _train(_config(tmp_path / 'b.py', PLAIN, 4), work, '--resume')
    assert plain.returncode != 0 and 'Weights only load failed' in plain.stderr, \
        plain.stdout[-2000:] + plain.stderr[-3000:]
    assert not osp.isfile(osp.join(work, 'iter_4.pth'))

    resumed = _train(_config(tmp_path / 'c.py', OPT_IN, 4), work, '--resume')
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert 'resumed' in log.lower() and 'iter_2.pth' in log, log[-4000:]
    assert osp.isfile(osp.join(work, 'iter_4.pth'))
