"""Ahead-of-time compilation of the LaplacianFormer kernels (Laplacian kernel, Newton-Schulz
inverse) for sm_80 and sm_90, without a GPU.

Compiles exactly the launches the launchers issue (see aot_worker_laplacian.py) and checks that
none uses a stack frame (no register spills, no local memory) and that shared memory fits the
target. A representative subset runs by default; ``--run-slow`` compiles the full matrix.
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


def lap(N, M, D, dtype, layout='contiguous'):
    return dict(op='laplacian', N=N, M=M, D=D, dtype=dtype, layout=layout)


def ns(M, iters=3, dtype='fp32'):
    return dict(op='newton_schulz', M=M, iters=iters, dtype=dtype)


# Laplacian kernel: the compiled code depends on the dtype, the D tiles (BD 8 / 16, or D < 8),
# and Triton's alignment specialisation of D and the strides (the token layout's strides are
# heads * D). N and M are runtime arguments.
# Newton-Schulz: the kernels only ever see fp32 padded buffers, so the code depends on the
# padded size MP (16, 32, 64, 128: whole-matrix or tiled kernels), whether the forward keeps
# its iterates, and Triton's specialisation of M and iters (== 1, divisible by 16).
FULL = ([lap(N, M, D, dtype, layout)
         for D in (5, 8, 24, 32, 40, 64)
         for dtype in ('fp16', 'bf16', 'fp32')
         for N, M in ((37, 13), (3136, 49))
         for layout in ('contiguous', 'tokens')]
        + [ns(M, iters) for M in (1, 13, 16, 17, 32, 33, 49, 64, 100, 128)
           for iters in (1, 3)])

# The default subset: the token layout in fp16 with an odd D, a contiguous bf16 case at the
# model's sizes (49 landmarks), a tiny D; Newton-Schulz at MP 16 (whole-matrix both ways), 64
# (whole-matrix forward, tiled backward) and 128 (tiled both ways).
SUBSET = [lap(37, 13, 24, 'fp16', 'tokens'), lap(3136, 49, 64, 'bf16'), lap(37, 13, 5, 'fp32'),
          ns(13), ns(40), ns(100)]


def compile_all(cases) -> list:
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    res = subprocess.run([sys.executable, osp.join(HERE, 'aot_worker_laplacian.py'),
                          json.dumps(cases), '80', '90'], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=3600)
    assert res.returncode == 0, \
        f'AOT compilation failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}'
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{')]


def check(results: list, kernels_expected: set) -> None:
    assert results, 'nothing was compiled'
    kernels = {r['kernel'] for r in results}
    assert kernels_expected <= kernels, kernels
    assert {r['arch'] for r in results} == {80, 90}
    for r in results:
        c = {k: v for k, v in r['constexprs'].items() if k != 'INPUT_PRECISION'}
        print(f"sm_{r['arch']} {r['kernel']:<31} {r['case']} {c} warps={r['num_warps']} "
              f"regs={r['regs']:<3} stack={r['stack']} shared={r['shared']}")
    bad = [r for r in results
           if r['stack'] or r['local'] or r['shared'] > SHARED_LIMIT[r['arch']]]
    assert not bad, 'spills / local memory / shared overflow:\n' + '\n'.join(map(str, bad))


ALL_KERNELS = {'laplacian_fwd_kernel', 'laplacian_bwd_kernel', 'newton_schulz_fwd_kernel',
               'newton_schulz_bwd_kernel', 'newton_schulz_fwd_tiled_kernel',
               'newton_schulz_bwd_tiled_kernel'}


def test_aot_compile_subset() -> None:
    check(compile_all(SUBSET), ALL_KERNELS)


@pytest.mark.slow
def test_aot_compile_full() -> None:
    check(compile_all(FULL), ALL_KERNELS)
