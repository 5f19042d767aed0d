"""Ahead-of-time compilation of the core-periphery attention kernels (VECA) for sm_80 and sm_90,
without a GPU.

Compiles exactly the launches the launchers issue (see aot_worker_veca.py) and checks that none
uses a stack frame (no register spills, no local memory) and that shared memory fits the target.
A representative subset runs by default; ``--run-slow`` compiles the full matrix.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from test_sema_aot import SHARED_LIMIT

triton = pytest.importorskip('triton')

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
KERNELS = {'cp_fwd_kernel', 'cp_bwd_dq_kernel', 'cp_bwd_dkdv_kernel',
           'sema_bwd_preprocess_kernel'}


def case(D, C, dtype, rope='batch', N=196, splits=None):
    return dict(op='core_periphery', D=D, C=C, N=N, dtype=dtype, rope=rope, splits=splits)


# Only the tile class changes the compiled code: dtype, padded head dim BD and whether D == BD,
# the core block (next_pow2(C), 16 at least, capped at the long block), rope or not, and for the
# core rows' long loops whether they write the final tensors or fp32 partials (a split), plus
# Triton's alignment specialisation of pointers and strides. Token counts, the number of cores
# and of splits are runtime arguments. C in {8, 20, 64} reaches every core block (16, 32, 64;
# fp32 caps at 32, so 64 cores are two blocks there).
FULL = [case(D, C, dtype, rope, splits=splits)
        for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
        for dtype in ('fp16', 'bf16', 'fp32')
        for C in (8, 20, 64)
        for rope in (None, 'batch', 'shared')
        for splits in (None, 2)]

# The default subset: VECA-S and VECA-B (both head dim 64) with 8 and 64 cores and per-sample
# rope tables in every dtype, plus a broadcast table, the split path and no rope.
SUBSET = [
    case(64, 8, 'fp16'), case(64, 64, 'fp16'), case(64, 64, 'bf16'), case(64, 8, 'bf16'),
    case(64, 8, 'fp32'), case(64, 64, 'fp32', 'shared'),
    case(64, 64, 'fp16', None, splits=2), case(64, 64, 'bf16', 'batch', splits=2),
]


def compile_all(cases) -> list:
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, osp.join(HERE, 'aot_worker_veca.py'),
                          json.dumps(cases), '80', '90'], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=7200)
    assert res.returncode == 0, \
        f'AOT compilation failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}'
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]


def check(results: list) -> None:
    assert results, 'nothing was compiled'
    assert KERNELS <= {r['kernel'] for r in results}, {r['kernel'] for r in results}
    assert {r['arch'] for r in results} == {80, 90}
    for r in results:
        c = r['constexprs']
        print(f"sm_{r['arch']} {r['role']:<17} {r['case']['dtype']} D={r['case']['D']:<3} "
              f"C={r['case']['C']:<3} BD={c['BD']:<3} BLOCK_M={c.get('BLOCK_M', '-'):<3} "
              f"BLOCK_N={c['BLOCK_N']:<3} rope={int(bool(c.get('ROPE')))} "
              f"warps={r['num_warps']} stages={r['num_stages']} regs={r['regs']:<3} "
              f"stack={r['stack']} shared={r['shared']}")
    bad = [r for r in results
           if r['stack'] or r['local'] or r['shared'] > SHARED_LIMIT[r['arch']]]
    assert not bad, 'spills / local memory / shared overflow:\n' + '\n'.join(map(str, bad))


def test_aot_compile_subset() -> None:
    check(compile_all(SUBSET))


@pytest.mark.slow
def test_aot_compile_full() -> None:
    check(compile_all(FULL))
