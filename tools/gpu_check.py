#!/usr/bin/env python
"""Everything that needs a CUDA GPU, as one command (under 10 minutes on one GPU).

    python tools/gpu_check.py --out-dir work_dirs/gpu_check

1. ``kernels``: every Triton kernel against its PyTorch reference (evaluated in fp64) at the
   sizes the backbones really use, forward and backward, in fp32 and bf16, with the tolerance
   table of ``tests/ops/tolerances.py``.
2. ``op_tests``: the op test suite (``tests/ops``), whose CUDA-only cases (bf16 ``tl.dot``,
   compiled kernels) are skipped on a machine without a GPU.
3. ``benchmark_ops``: ``tools/benchmark_ops.py --preset gpu`` (Triton vs reference vs SDPA and
   linear attention, against the measured matmul rate and copy bandwidth).
4. ``benchmark``: ``tools/benchmark.py --preset gpu`` (every backbone, CUDA-event timing, the
   Triton path; ``--dtype bf16`` with ``--bf16``).

Each step has a time limit (the total fits in 10 minutes); its result, time and log go to
``<out-dir>/gpu_check.json`` and ``<out-dir>/<step>.log``. Without a CUDA device it stops at
once with exit status 2 and says so.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

#: seconds per step (sum < 600 with room for start-up)
STEP_LIMITS = dict(kernels=90, op_tests=140, benchmark_ops=100, benchmark=230)
NO_CUDA_EXIT = 2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out-dir', default='work_dirs/gpu_check')
    p.add_argument('--steps', nargs='+', choices=list(STEP_LIMITS), default=list(STEP_LIMITS))
    p.add_argument('--bf16', action='store_true', help='backbone benchmark in bf16 autocast')
    return p.parse_args(argv)


def cuda_problem() -> str:
    """Why this machine cannot run the GPU checks ('' when it can)."""
    try:
        import torch
    except Exception as e:  # pragma: no cover
        return f'torch is not importable ({e})'
    if not torch.cuda.is_available():
        return (f'no CUDA device is visible to torch {torch.__version__} (CUDA build: '
                f'{torch.version.cuda or "none"}); run this on a machine with an NVIDIA GPU')
    from mmeffattn.ops import _backend
    if not _backend.HAS_TRITON:
        return 'triton is not importable, so the kernels cannot be checked'
    if _backend.TRITON_INTERPRET:
        return 'TRITON_INTERPRET is set: unset it so the kernels are compiled for the GPU'
    return ''


# --------------------------------------------------------------------------------------------
# step 1: kernels vs references at realistic sizes
# --------------------------------------------------------------------------------------------
def kernel_cases() -> List[Tuple[str, Callable[[Any, Any], Tuple[Callable, List[Any]]]]]:
    """``(name, make(device, dtype) -> (fn(backend, *inputs), inputs))`` per op and size. Sizes:
    SEMA-T stage 1 at 224 (batch 8) and 512; VECA-S (C=64) at 224 and 512; LaplacianFormer-T
    stage 1 (landmarks 8x8 cells) at 224 and 512; WeightFormer-T's dynamic layers at 224."""
    import torch

    from mmeffattn import ops

    def randn(*shape, device, dtype, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)

    def sema(B, h, side, D):
        def make(device, dtype):
            x = [randn(B, h, side * side, D, device=device, dtype=dtype) for _ in range(3)]
            return (lambda b, q, k, v: ops.sema_attention(q, k, v, (side, side), 7, backend=b),
                    x)
        return make

    def core(B, h, C, N, D):
        def make(device, dtype):
            x = [randn(B, h, C + N, D, device=device, dtype=dtype) for _ in range(3)]
            ang = torch.rand(1, C + N, D // 2, device=device).repeat_interleave(2, -1) * 6.28
            rope = (ang.cos(), ang.sin())
            return (lambda b, q, k, v: ops.core_periphery_attention(q, k, v, C, rope=rope,
                                                                    backend=b), x)
        return make

    def laplacian(B, h, N, M, D):
        def make(device, dtype):
            x = [randn(B, h, N, D, device=device, dtype=dtype, scale=0.3),
                 randn(B, h, M, D, device=device, dtype=dtype, scale=0.3)]
            return lambda b, x, y: ops.laplacian_kernel(x, y, 4.0, backend=b), x
        return make

    def newton(B, h, M, D):
        def make(device, dtype):
            z = randn(B, h, M, D, device=device, dtype=torch.float32, scale=0.3)
            a = ops.laplacian_kernel_naive(z, z, 4.0).to(dtype)  # a real landmark kernel matrix
            return lambda b, a: ops.newton_schulz_pinv(a, 20, 0.01, backend=b), [a]
        return make

    def dyn_weight(B, M, c_in, c_out):
        def make(device, dtype):
            x = [randn(B, M, c_in, device=device, dtype=dtype),
                 randn(B, M, c_out, device=device, dtype=dtype),
                 randn(c_out, c_in, device=device, dtype=dtype, scale=0.02)]
            return (lambda b, u, v, w: ops.dynamic_weight(u, v, 196, weight=w, backend=b), x)
        return make

    def dyn_dwconv(B, C, side):
        def make(device, dtype):
            x = [randn(B, C, side, side, device=device, dtype=dtype),
                 randn(B, C, 3, 3, device=device, dtype=dtype),
                 randn(C, device=device, dtype=dtype), randn(C, 1, 3, 3, device=device,
                                                           dtype=dtype)]
            return (lambda b, x, k, bias, w: ops.dynamic_dwconv(x, k, bias, w, normalize=True,
                                                                backend=b), x)
        return make

    return [('sema B8-H2-56x56-D32', sema(8, 2, 56, 32)),
            ('sema B2-H2-128x128-D32', sema(2, 2, 128, 32)),
            ('core_periphery B8-H6-C64-N196-D64', core(8, 6, 64, 196, 64)),
            ('core_periphery B2-H6-C64-N1024-D64', core(2, 6, 64, 1024, 64)),
            ('laplacian_kernel B8-H1-N3136-M49-D64', laplacian(8, 1, 3136, 49, 64)),
            ('laplacian_kernel B2-H1-N16384-M256-D64', laplacian(2, 1, 16384, 256, 64)),
            ('newton_schulz_pinv B8-H1-M49', newton(8, 1, 49, 64)),
            ('newton_schulz_pinv B2-H1-M256', newton(2, 1, 256, 64)),
            ('dynamic_weight B8-M49-192x768', dyn_weight(8, 49, 192, 768)),
            ('dynamic_dwconv B8-C768-14x14', dyn_dwconv(8, 768, 14))]


def check_kernels(out_dir: str, device: str = 'cuda', backend: str = 'triton',
                  dtypes: Tuple[str, ...] = ('float32', 'bfloat16'),
                  only: str = '') -> Dict[str, Any]:
    """``backend`` (the Triton kernels; ``'reference'`` checks this harness itself on a CPU) in
    each of ``dtypes`` vs the reference in fp64: the output and every input gradient. ``only``
    keeps the cases whose name contains it."""
    import torch
    sys.path.insert(0, osp.join(ROOT, 'tests', 'ops'))
    from tolerances import assert_close
    device = torch.device(device)
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name, make in kernel_cases():
        if only not in name:
            continue
        for dtype in (getattr(torch, d) for d in dtypes):
            row = dict(case=name, dtype=str(dtype).replace('torch.', ''))
            t0 = time.time()
            try:
                torch.manual_seed(0)
                fn, inputs = make(device, dtype)
                xs = [x.detach().clone().requires_grad_() for x in inputs]
                out = fn(backend, *xs)
                grad = torch.randn_like(out, dtype=torch.float32).to(out.dtype)
                out.backward(grad)
                refs = [x.detach().double().requires_grad_() for x in inputs]
                ref = fn('reference', *refs)
                ref.backward(grad.double())
                assert_close(out, ref, dtype, name='output')
                for i, (x, r) in enumerate(zip(xs, refs)):
                    if r.grad is not None:
                        assert x.grad is not None, f'input {i}: no gradient from the kernels'
                        assert_close(x.grad, r.grad, dtype, name=f'grad of input {i}')
                row['status'] = 'ok'
            except Exception as e:
                row['status'] = 'FAIL'
                row['error'] = f'{type(e).__name__}: {e}'[:2000]
            row['seconds'] = round(time.time() - t0, 2)
            rows.append(row)
            print(f'  {row["status"]:4} {name} [{row["dtype"]}] {row.get("error", "")[:200]}',
                  flush=True)
            if device.type == 'cuda':
                torch.cuda.empty_cache()
    with open(osp.join(out_dir, 'kernels.json'), 'w') as f:
        json.dump(rows, f, indent=1)
    failed = [r for r in rows if r['status'] != 'ok']
    return dict(status='ok' if not failed else 'FAIL', checked=len(rows), failed=len(failed))


# --------------------------------------------------------------------------------------------
# steps 2-4: subprocesses
# --------------------------------------------------------------------------------------------
def run_step(name: str, cmd: List[str], out_dir: str, limit: int) -> Dict[str, Any]:
    log = osp.join(out_dir, f'{name}.log')
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env.pop('TRITON_INTERPRET', None)
    with open(log, 'w') as f:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  timeout=limit)
            status = 'ok' if proc.returncode == 0 else f'FAIL (exit {proc.returncode})'
        except subprocess.TimeoutExpired:
            status = f'FAIL (time limit {limit} s)'
    return dict(status=status, command=' '.join(cmd), log=log)


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = cuda_problem()
    if problem:
        print(f'gpu_check: cannot run: {problem}', file=sys.stderr)
        return NO_CUDA_EXIT
    os.makedirs(args.out_dir, exist_ok=True)
    py = sys.executable
    steps = {
        'kernels': lambda: check_kernels(args.out_dir),
        'op_tests': lambda: run_step('op_tests', [py, '-m', 'pytest', 'tests/ops', '-q', '-x',
                                                  '-p', 'no:cacheprovider'],
                                     args.out_dir, STEP_LIMITS['op_tests']),
        'benchmark_ops': lambda: run_step(
            'benchmark_ops', [py, 'tools/benchmark_ops.py', '--preset', 'gpu', '--out-dir',
                              osp.join(args.out_dir, 'ops')],
            args.out_dir, STEP_LIMITS['benchmark_ops']),
        'benchmark': lambda: run_step(
            'benchmark', [py, 'tools/benchmark.py', '--preset', 'gpu', '--out-dir',
                          osp.join(args.out_dir, 'backbones'),
                          '--dtype', 'bf16' if args.bf16 else 'fp32'],
            args.out_dir, STEP_LIMITS['benchmark']),
    }
    summary: Dict[str, Any] = {}
    t_all = time.time()
    for name in args.steps:
        print(f'[{name}] (limit {STEP_LIMITS[name]} s)', flush=True)
        t0 = time.time()
        try:
            summary[name] = steps[name]()
        except Exception as e:
            summary[name] = dict(status='FAIL', error=f'{type(e).__name__}: {e}',
                                 traceback=traceback.format_exc()[-3000:])
        summary[name]['seconds'] = round(time.time() - t0, 1)
        print(f'[{name}] {summary[name]["status"]} in {summary[name]["seconds"]} s', flush=True)
    summary['total_seconds'] = round(time.time() - t_all, 1)
    from mmeffattn.analysis.benchmarking import environment
    import torch
    summary['environment'] = environment(torch.device('cuda'), torch.float32)
    with open(osp.join(args.out_dir, 'gpu_check.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    ok = all(v['status'] == 'ok' for k, v in summary.items() if k in STEP_LIMITS)
    print(f'gpu_check: {"all steps passed" if ok else "FAILURES"}; '
          f'{args.out_dir}/gpu_check.json ({summary["total_seconds"]} s)')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
