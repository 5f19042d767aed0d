"""Run the project's tools as a user would: in a subprocess, from the project root."""
import os
import os.path as osp
import re
import subprocess
import sys
from typing import List

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_CRASH_LINE = re.compile(r'terminate called|what\(\)|Error:|Aborted|Segmentation fault')


def run_tool(args: List[str], timeout: int = 600, expect_ok: bool = True,
             env: dict = None) -> subprocess.CompletedProcess:
    """Run ``args`` (e.g. ['tools/train.py', cfg, ...]) with this interpreter from ROOT."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable, **(env or {}))
    full_env.pop('TRITON_INTERPRET', None)  # models use the reference path on CPU
    cmd = args if args[0] in ('bash', 'sh') else [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    if expect_ok and proc.returncode != 0:
        # the cause of a crash (a C++ abort, a child's traceback) can be far from the tail
        # that a launcher's own report fills, so its lines are quoted first
        causes = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if _CRASH_LINE.search(line)][:30]
        raise AssertionError(f'{" ".join(cmd)} failed ({proc.returncode}):\n'
                             + ''.join(f'  cause? {line}\n' for line in causes)
                             + f'{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}')
    return proc


def write_config(path, base: str, body: str) -> str:
    """A user config that inherits one of ours by absolute path and overrides ``body``."""
    text = f'_base_ = {osp.join(ROOT, base)!r}\n' + body
    with open(path, 'w') as f:
        f.write(text)
    return str(path)


#: Config lines for a training-only run (no validation or test loop), appended to a config body.
NO_EVAL = '''
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
'''
