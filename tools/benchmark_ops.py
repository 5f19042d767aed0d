#!/usr/bin/env python
"""Benchmark the attention ops alone against full softmax attention and plain linear attention.

    python tools/benchmark_ops.py --preset readme --out-dir work_dirs/benchmark_ops

For each token count N (a square grid), each attention kind runs on ``[B, heads, N, D]`` inputs
(WeightFormer's token mixers on ``heads * D`` channels): time, peak memory, analytic MACs and the
achieved FLOP/s against the machine's measured matmul rate and copy bandwidth (the roofline). On
a CUDA GPU our ops run with their Triton kernels and their PyTorch backend; on a CPU with the
latter only.
"""
import argparse
import json
import math
import os
import os.path as osp
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

from mmeffattn import ops
from mmeffattn.analysis.flops import op_macs, sdpa_macs
from mmeffattn.analysis.report import fmt, md_table, write_outputs
from mmeffattn.ops._spec import (CORE_PERIPHERY, DYNAMIC_WEIGHT, LAPLACIAN, NEWTON_SCHULZ,
                                 SPECS, get_spec)

#: LaplacianFormer's first stage: landmarks pooled in cells of 8 x 8 tokens, at most 128
LANDMARK_CELL, MAX_LANDMARKS = 8, 128

PRESETS: Dict[str, Dict[str, Any]] = {
    'smoke': dict(tokens=[196, 784], batch=1, heads=2, head_dim=32, warmup=1, repeats=2,
                  budget_s=60., max_call_s=10.),
    'readme': dict(tokens=[196, 784, 3136, 12544, 65536], batch=1, heads=4, head_dim=32,
                   warmup=1, repeats=3, budget_s=40., max_call_s=5.),
    'full': dict(tokens=[196, 784, 3136, 12544, 16384, 50176, 65536], batch=1, heads=4,
                 head_dim=32, warmup=2, repeats=10, budget_s=600., max_call_s=60.),
    # inside the GPU script's 100 s: 12 variants (5 ops x Triton/torch, SDPA, linear)
    'gpu': dict(tokens=[196, 784, 3136, 12544, 16384, 50176, 65536], batch=4, heads=8,
                head_dim=64, warmup=3, repeats=10, budget_s=4., max_call_s=0.2),
}
BASELINES = ('softmax', 'linear')  # plain PyTorch, no backend choice


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--preset', choices=sorted(PRESETS), default='readme')
    p.add_argument('--tokens', type=int, nargs='+', help='N values (rounded to a square grid)')
    p.add_argument('--kinds', nargs='+', choices=KINDS, default=list(KINDS))
    for key in ('batch', 'heads', 'head_dim', 'warmup', 'repeats'):
        p.add_argument(f'--{key.replace("_", "-")}', type=int)
    p.add_argument('--budget-s', type=float, help='measurement seconds per kind, all N')
    p.add_argument('--max-call-s', type=float, help='skip an N predicted to take longer')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--dtype', choices=['fp32', 'bf16', 'fp16'], default='fp32')
    p.add_argument('--threads', type=int)
    p.add_argument('--out-dir', default='work_dirs/benchmark_ops')
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


# -- the attention kinds: (run(backend) closure, MACs, minimum bytes moved) --
def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain linear attention with the ELU+1 feature map: ``phi(q) (phi(k)^T v)`` normalized
    by ``phi(q) sum_j phi(k_j)``; ``[B, h, N, D]`` in and out."""
    q, k = F.elu(q) + 1, F.elu(k) + 1
    kv = k.transpose(-2, -1) @ v  # [B, h, D, D]
    z = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)  # [B, h, N, 1]
    return (q @ kv) / (z + 1e-6)


#: our ops' kinds, each at about n tokens on a square grid (WeightFormer's on heads * D channels)
KINDS = BASELINES + ('core_periphery', 'dynamic_dwconv', 'dynamic_linear', 'laplacian_nystrom',
                     'sema')


def make_kind(kind: str, n: int, args: argparse.Namespace, device: torch.device,
              dtype: torch.dtype) -> Tuple[Callable[[Optional[str]], Any], int, int, Dict]:
    """Inputs for ``kind`` at about ``n`` tokens: ``(run(backend), MACs, bytes, shape info)``;
    our ops from their ``spec.example``."""
    side = max(1, round(math.sqrt(n)))
    N, B, h, D = side * side, args.batch, args.heads, args.head_dim
    info, sizes = dict(N=N, grid=[side, side], tokens=N), dict(device=device, dtype=dtype, B=B)
    if kind in BASELINES:  # plain PyTorch on [B, heads, N, D] q, k, v
        q, k, v = (torch.randn(B, h, N, D, device=device, dtype=dtype) for _ in range(3))
        run, macs = dict(softmax=(lambda b: F.scaled_dot_product_attention(q, k, v),
                                  sdpa_macs(B * h, N, N, D, D)),
                         linear=(lambda b: linear_attention(q, k, v),
                                 B * h * N * D * (2 * D + 1)))[kind]
        return run, macs, 4 * q.numel() * q.element_size(), info
    if kind == 'sema':
        return _run('sema_attention', info, **sizes, heads=h, H=side, W=side, D=D,
                    layout='contiguous')
    if kind == 'core_periphery':
        C = CORE_PERIPHERY.settings['num_cores']
        return _run('core_periphery_attention', dict(info, tokens=N + C, num_cores=C), **sizes,
                    heads=h, C=C, N=N, D=D, rope=None)
    if kind == 'dynamic_dwconv':
        return _run('dynamic_dwconv', dict(info, channels=h * D), **sizes, C=h * D, H=side,
                    W=side)
    if kind == 'dynamic_linear':
        C, M = h * D, math.ceil(side / DYNAMIC_WEIGHT.settings['pool']) ** 2
        x = torch.randn(B, N, C, device=device, dtype=dtype)
        weight, macs, nbytes, _ = _run('dynamic_weight', {}, **sizes, M=M, C_in=C, C_out=C,
                                       n_tokens=N)
        return (lambda b: x @ weight(b).transpose(1, 2), macs + B * N * C * C,
                nbytes + 2 * x.numel() * x.element_size(), dict(info, channels=C, pooled=M))
    if kind == 'laplacian_nystrom':
        return laplacian_nystrom(side, args, device, dtype)
    raise ValueError(f'unknown kind {kind!r}; choose from {KINDS}')


def _run(spec_name: str, info: Dict[str, Any], **sizes: Any):
    """The op's ``spec.example(**sizes)``: ``(run(backend), MACs, bytes of the inputs and the
    output, info)`` (the output's shape from a call on fake tensors)."""
    ex = get_spec(spec_name).example(**sizes)

    def run(b, *inputs):
        return ex.fn(b, *(inputs or ex.inputs))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = run('torch', *map(mode.from_tensor, ex.inputs))
    nbytes = sum(t.numel() * t.element_size() for t in ex.inputs + tree_flatten(out)[0])
    return run, ex.macs, nbytes, info


def laplacian_nystrom(side: int, s: Any, device: torch.device, dtype: torch.dtype):
    """LaplacianFormer's attention on ``[B, heads, N, D]`` q, v, heads split off ``[B, N, heads*D]``
    tokens as in the backbone (its keys are its queries): the backbone's
    :func:`~mmeffattn.models.layers.nystrom.nystrom_attention` with this op's kernel matrices and
    the inverse of ``newton_schulz_pinv``."""
    from mmeffattn.models.backbones.laplacianformer import landmark_cell
    from mmeffattn.models.layers.nystrom import nystrom_attention, pool_landmarks
    hw, N = (side, side), side * side
    B, h, D = s.batch, s.heads, s.head_dim
    q, v = (torch.randn(B, N, h, D, device=device, dtype=dtype).transpose(1, 2) for _ in range(2))
    cell = landmark_cell(hw, LANDMARK_CELL, MAX_LANDMARKS)
    M = math.ceil(hw[0] / cell) * math.ceil(hw[1] / cell)
    lam = LAPLACIAN.settings['lam']
    iters, eps = NEWTON_SCHULZ.settings['iters'], NEWTON_SCHULZ.settings['eps']

    def run(b):
        return nystrom_attention(
            q, pool_landmarks(q, hw, cell), partial(ops.laplacian_kernel, lam=lam, backend=b),
            lambda a, r: ops.newton_schulz_pinv(a, iters, eps, backend=b) @ r, v)

    lm = torch.empty(B, h, M, D)
    total = (op_macs('laplacian_kernel', q, lm) + op_macs('laplacian_kernel', lm, lm)
             + op_macs('newton_schulz_pinv', torch.empty(B, h, M, M), iters, eps)
             + B * h * (2 * N * M * D + M * M * D))  # K^T v, pinv @ (.), K @ (.)
    return run, total, 3 * q.numel() * q.element_size(), dict(N=N, grid=list(hw), tokens=N,
                                                               landmarks=M)


# -- the run --
def run(args: argparse.Namespace) -> Dict[str, Any]:
    from mmeffattn.analysis import benchmarking as bm
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: no CUDA device is visible to torch')
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16, fp16=torch.float16)[args.dtype]
    t_start = time.time()
    machine = dict(matmul=bm.matmul_flops_per_s(device, dtype),
                   copy=bm.copy_bandwidth(device))
    peak_flops = machine['matmul']['flops_per_s']
    bandwidth = machine['copy']['bytes_per_s']
    # our ops: Triton and the torch backend on a GPU; the torch backend alone on a CPU
    ours_backends = ['triton', 'torch'] if device.type == 'cuda' else ['torch']
    variants = [(kind, b) for kind in args.kinds
                for b in ([None] if kind in BASELINES else ours_backends)]
    state = {v: dict(spent=0., hist=[], stopped='') for v in variants}
    results: List[Dict[str, Any]] = []
    for n in sorted(args.tokens):
        for variant in variants:
            kind, backend = variant
            st = state[variant]
            rec = dict(kind=kind, backend=backend or 'torch', N_requested=n, status='ok',
                       ms=None, peak_mem_mb=None)
            results.append(rec)
            pred = bm.predict_power_law(st['hist'], n)
            calls = args.warmup + args.repeats
            if st['stopped']:
                rec['status'] = st['stopped']
                continue
            if pred > args.max_call_s or st['spent'] + calls * pred > args.budget_s:
                rec['status'] = st['stopped'] = 'skipped (time limit)'
                continue
            t0 = time.time()
            try:
                fn, macs, nbytes, info = make_kind(kind, n, args, device, dtype)
                rec.update(info, macs=macs, bytes=nbytes)
                with torch.no_grad():
                    for _ in range(args.warmup):
                        bm.time_once(lambda: fn(backend), device)
                    ts = [bm.time_once(lambda: fn(backend), device) for _ in range(args.repeats)]
                    mem = bm.peak_memory(lambda: fn(backend), [], device)
            except Exception as e:
                if bm.is_oom(e):
                    rec['status'] = st['stopped'] = 'out of memory'
                else:
                    rec['status'] = f'error: {type(e).__name__}: {str(e)[:300]}'
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
                continue
            finally:
                st['spent'] += time.time() - t0
            secs = bm.median(ts)
            st['hist'].append((n, secs))
            intensity = 2 * macs / nbytes
            bound = min(peak_flops, intensity * bandwidth)
            rec.update(ms=secs * 1e3, peak_mem_mb=mem / 2**20, flops_per_s=2 * macs / secs,
                       of_matmul_peak=2 * macs / secs / peak_flops,
                       arithmetic_intensity=intensity, roofline_flops_per_s=bound,
                       of_roofline=2 * macs / secs / bound)
            print(f'N={rec["N"]:>6} {kind:>17} [{rec["backend"]}]: {rec["ms"]:9.2f} ms, '
                  f'{rec["flops_per_s"] / 1e9:8.2f} GFLOP/s '
                  f'({100 * rec["of_matmul_peak"]:.1f}% of matmul)', flush=True)
        if device.type == 'cuda':
            torch.cuda.empty_cache()
        if getattr(args, 'out_dir', None):  # a run stopped from outside keeps what it measured
            with open(osp.join(args.out_dir, 'benchmark_ops.partial.json'), 'w') as f:
                json.dump(dict(machine=machine, results=results), f)
    from mmeffattn.analysis.benchmarking import fit_exponent
    exps = {}
    for kind, backend in variants:
        rows = [r for r in results if r['kind'] == kind and r['backend'] == (backend or 'torch')
                and r['ms'] is not None]
        exps[f'{kind}[{backend or "torch"}]'] = dict(
            time=fit_exponent([r['N'] for r in rows], [r['ms'] for r in rows]),
            memory=fit_exponent([r['N'] for r in rows], [r['peak_mem_mb'] for r in rows]))
    settings = {k: getattr(args, k) for k in ('preset', 'batch', 'heads', 'head_dim', 'warmup',
                                              'repeats', 'budget_s', 'max_call_s')}
    settings.update(landmark_cell=LANDMARK_CELL, max_landmarks=MAX_LANDMARKS,
                    ops={spec.name: spec.settings for spec in SPECS})
    env = bm.environment(device, dtype)
    if device.type != 'cuda':  # no resident tensors here: the op's own allocations only
        env['memory_method'] = ('peak of the tensors the call creates (its inputs excluded), '
                                'tracked per storage by a torch dispatch mode')
    return dict(environment=env, machine=machine, settings=settings,
                results=results, exponents=exps, elapsed_s=time.time() - t_start)


def markdown(report: Dict[str, Any]) -> str:
    env, s, m = report['environment'], report['settings'], report['machine']
    lines = [f'Device: {env["device"]} ({env.get("gpu", env["processor"])}), {env["threads"]} '
             f'threads, {env["dtype"]}; B={s["batch"]}, heads={s["heads"]}, D={s["head_dim"]}; '
             f'median of {s["repeats"]} after {s["warmup"]} warm-up. Measured limits: matmul '
             f'{m["matmul"]["flops_per_s"] / 1e9:.1f} GFLOP/s (n={m["matmul"]["n"]}), copy '
             f'{m["copy"]["bytes_per_s"] / 1e9:.1f} GB/s. FLOP/s count 2 per MAC. Memory: '
             f'{env["memory_method"]}.', '']
    rows = [[r.get('N', r['N_requested']), r['kind'], r['backend']] + (
        [r['status'], '', '', '', ''] if r['ms'] is None else
        [f'{r["ms"]:.2f}', f'{r["peak_mem_mb"]:.2f}', f'{r["flops_per_s"] / 1e9:.2f}',
         f'{100 * r["of_matmul_peak"]:.1f}%', f'{100 * r["of_roofline"]:.1f}%'])
        for r in report['results']]
    lines += md_table(['N', 'kind', 'backend', 'ms', 'peak mem (MB)', 'GFLOP/s', 'of matmul',
                       'of roofline'], rows, 'rllrrrrr') + ['']
    lines += md_table(['kind [backend]', 'time ~ N^k', 'memory ~ N^k'],
                      [[n, fmt(k['time'], 2), fmt(k['memory'], 2)]
                       for n, k in report['exponents'].items()], 'lrr')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    report = run(args)
    write_outputs(args.out_dir, {'benchmark_ops.json': report,
                                 'benchmark_ops.md': markdown(report)})
    print(f'wrote {args.out_dir}/benchmark_ops.json, benchmark_ops.md '
          f'({report["elapsed_s"]:.0f} s)')
    return report


if __name__ == '__main__':
    main()
