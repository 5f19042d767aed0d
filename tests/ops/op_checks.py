"""What the op tests share: the header (device, dtype table, the Triton skip mark), the RMS-error
comparison with the op's tolerance table, the "imports without Triton" subprocess check and the
ahead-of-time compilation run and check (``tests/ops/aot_worker.py``)."""
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Optional

import pytest
import torch

from mmeffattn.ops import _backend
from mmeffattn.ops._spec import DEFAULT_TOLERANCES, DTYPES, Tolerance, check_close, rms  # noqa

HAS_CUDA = torch.cuda.is_available()
DEVICE = 'cuda' if HAS_CUDA else 'cpu'
TRITON_RUNNABLE = _backend.HAS_TRITON and (HAS_CUDA or _backend.TRITON_INTERPRET)
needs_triton = pytest.mark.skipif(not TRITON_RUNNABLE,
                                  reason='needs Triton with a CUDA GPU or its CPU interpreter')
HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
#: shared memory per block (bytes): sm_80 163 KB, sm_90 227 KB
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                 name: str = 'tensor',
                 tolerances: Optional[Dict[torch.dtype, Tolerance]] = None) -> None:
    """``actual`` (computed in ``dtype``) against ``expected`` (usually the reference in fp64)
    within the tolerance table (default: :data:`mmeffattn.ops._spec.DEFAULT_TOLERANCES`)."""
    check_close(actual, expected, dtype, name, tolerances or DEFAULT_TOLERANCES)


def check_import_without_triton(lines: List[str]) -> None:
    """Run ``lines`` in a fresh interpreter where ``import triton`` fails; they must run to
    the end (the op's reference runs, and an explicit Triton request names the reason)."""
    code = '\n'.join(['import sys; sys.modules["triton"] = None  # "import triton" raises',
                      *lines, 'print("ok")'])
    env = {k: v for k, v in os.environ.items() if k != _backend.ENV_VAR}
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == 'ok', res.stderr


def triton_request_fails(call: str) -> List[str]:
    """Lines that make ``call`` (with ``backend="triton"``) and check it raises the
    "triton is not importable" RuntimeError."""
    return ['try:', f'    {call}', 'except RuntimeError as e:',
            '    assert "triton is not importable" in str(e), e',
            'else:', '    raise AssertionError("no error")']


def aot_compile(cases: List[dict], archs=(80, 90)) -> List[dict]:
    """Compile the cases' launches with ``tests/ops/aot_worker.py`` (interpreter off); one dict
    per (launch, arch)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, osp.join(HERE, 'aot_worker.py'), json.dumps(cases),
                          *map(str, archs)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=7200)
    assert res.returncode == 0, \
        f'AOT compilation failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}'
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]


def check_aot(results: List[dict], kernels: frozenset, archs=(80, 90)) -> None:
    """Every expected kernel compiled for every arch, without a stack frame (no register
    spills, no local memory) and within the target's shared memory."""
    assert results, 'nothing was compiled'
    assert kernels <= {r['kernel'] for r in results}, {r['kernel'] for r in results}
    assert {r['arch'] for r in results} == set(archs)
    for r in results:
        c = {k: v for k, v in r['constexprs'].items() if k != 'INPUT_PRECISION'}
        print(f"sm_{r['arch']} {r['kernel']:<32} {r['role']:<16} {r['case']} {c} "
              f"warps={r['num_warps']} stages={r['num_stages']} regs={r['regs']:<3} "
              f"stack={r['stack']} shared={r['shared']}")
    bad = [r for r in results
           if r['stack'] or r['local'] or r['shared'] > SHARED_LIMIT[r['arch']]]
    assert not bad, 'spills / local memory / shared overflow:\n' + '\n'.join(map(str, bad))
