"""Ahead-of-time compilation of the SEMA kernels for sm_80 and sm_90, without a GPU.

Compiles exactly the launches the launchers issue (see aot_worker.py) and checks that none uses
a stack frame (no register spills, no local memory) and that shared memory fits the target.
A representative subset runs by default; ``--run-slow`` compiles the full matrix.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

triton = pytest.importorskip('triton')

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
#: shared memory per block (bytes): sm_80 163 KB, sm_90 227 KB
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}


def case(D, window, H, W, dtype, with_mean=True, layout='backbone'):
    return dict(D=D, window=window, H=H, W=W, dtype=dtype, with_mean=with_mean, layout=layout)


# Only the tile class changes the compiled code: dtype, padded head dim BD, whether D == BD,
# one block per window or several, the block size, with/without the mean (plus Triton's
# alignment specialisation of pointers and strides). Grid geometry, block count and head dim
# are runtime arguments. Window token counts 12, 30, 49 and 144 hit every block class (16, 32,
# 64 tokens in one block; several blocks), so FULL compiles every tile class there is.
FULL = [case(D, window, H, W, dtype, with_mean, layout)
        for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
        for dtype in ('fp16', 'bf16', 'fp32')
        for window, H, W in ((7, 3, 4), (7, 5, 6), (7, 14, 14), (12, 24, 24))
        for with_mean in (True, False)
        for layout in ('backbone', 'contiguous')]

# The default subset: the backbone's head dim 32 with window 7 in every dtype, plus one case of
# each other kind of tile (D=128, several blocks per window, small windows, odd D, no mean).
SUBSET = [
    case(32, 7, 14, 14, 'fp16'), case(32, 7, 14, 14, 'bf16'), case(32, 7, 14, 14, 'fp32'),
    case(128, 7, 14, 14, 'bf16'), case(128, 7, 14, 14, 'fp32'),
    case(40, 12, 24, 24, 'fp16', with_mean=False), case(128, 12, 24, 24, 'bf16'),
    case(64, 12, 24, 24, 'fp32'), case(72, 7, 3, 4, 'fp16'), case(24, 7, 5, 6, 'fp32'),
]


def compile_all(cases) -> list:
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, osp.join(HERE, 'aot_worker.py'), json.dumps(cases),
                          '80', '90'], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=3600)
    assert res.returncode == 0, \
        f'AOT compilation failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}'
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]


def check(results: list) -> None:
    assert results, 'nothing was compiled'
    kernels = {r['kernel'] for r in results}
    assert {'sema_fwd_window_kernel', 'sema_bwd_window_kernel', 'sema_fwd_kernel',
            'sema_bwd_kernel', 'sema_bwd_preprocess_kernel'} <= kernels, kernels
    assert {r['arch'] for r in results} == {80, 90}
    for r in results:
        c = r['constexprs']
        print(f"sm_{r['arch']} {r['kernel']:<27} {r['case']['dtype']} D={r['case']['D']:<3} "
              f"BD={c['BD']:<3} BLOCK={c.get('BLOCK', c.get('BLOCK_N')):<3} "
              f"mean={int(c['WITH_MEAN'])} warps={r['num_warps']} stages={r['num_stages']} "
              f"regs={r['regs']:<3} stack={r['stack']} shared={r['shared']}")
    bad = [r for r in results
           if r['stack'] or r['local'] or r['shared'] > SHARED_LIMIT[r['arch']]]
    assert not bad, 'spills / local memory / shared overflow:\n' + '\n'.join(map(str, bad))


def test_aot_compile_subset() -> None:
    check(compile_all(SUBSET))


@pytest.mark.slow
def test_aot_compile_full() -> None:
    check(compile_all(FULL))
