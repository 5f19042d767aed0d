#!/usr/bin/env python
"""Everything that needs a CUDA GPU, as one command (under 10 minutes on one GPU).

    python tools/gpu_check.py --out-dir work_dirs/gpu_check

1. ``kernels``: every Triton kernel against its fp64 reference at the backbones' sizes
   (:data:`KERNEL_CASES`), forward and backward, fp32 and bf16, with each op's tolerances; timed
   next to its roofline prediction where it has one (:mod:`mmeffattn.analysis.kernels`).
2. ``op_tests``: ``tests/ops``, whose CUDA-only cases are skipped elsewhere.
3. ``benchmark_ops``: ``tools/benchmark_ops.py --preset gpu``.
4. ``benchmark``: ``tools/benchmark.py --preset gpu`` (``--dtype bf16`` with ``--bf16``).

Each step has a time limit; results go to ``<out-dir>/gpu_check.{json,md}`` and
``<out-dir>/<step>.log``. Without a CUDA device it exits with status 2. ``--dry-run`` runs the
same steps on the CPU at smoke sizes: it checks the plumbing and measures nothing. Offline GPU
machines: ``scripts/gpu_device.sh`` (``docs/perf/gpu.md``).
"""
import argparse
import functools
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from mmeffattn.analysis import kernels
from mmeffattn.analysis.benchmarking import environment, median, time_once
from mmeffattn.analysis.report import md_table, write_outputs
from mmeffattn.ops import _backend
from mmeffattn.ops._spec import DEFAULT_TOLERANCES, SPECS, check_close

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

#: seconds per step (sum < 600 with room for start-up)
STEP_LIMITS = dict(kernels=90, op_tests=140, benchmark_ops=100, benchmark=230)
#: steps run only when named in --steps: ours against LaplacianFormer's official CUDA operators
#: (compiled there with nvcc first), with ``--laplacianformer-root``
OPTIONAL_STEP_LIMITS = dict(official_kernels=300)
NO_CUDA_EXIT = 2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out-dir', default='work_dirs/gpu_check')
    p.add_argument('--steps', nargs='+', choices=list(STEP_LIMITS) + list(OPTIONAL_STEP_LIMITS),
                   default=list(STEP_LIMITS))
    p.add_argument('--laplacianformer-root', help='official checkout for the official_kernels '
                   'step (tools/analysis_tools/compare_official_kernels.py)')
    p.add_argument('--bf16', action='store_true', help='backbone benchmark in bf16 autocast')
    p.add_argument('--dry-run', action='store_true',
                   help='every step on this CPU at smoke sizes: checks the plumbing only')
    args = p.parse_args(argv)
    if 'official_kernels' in args.steps and not args.laplacianformer_root:
        p.error('the official_kernels step needs --laplacianformer-root (a checkout of '
                'github.com/BirdWithDreams/LaplacianFormer)')
    return args


def cuda_problem() -> str:
    """Why this machine cannot run the GPU checks ('' when it can)."""
    if not torch.cuda.is_available():
        return (f'no CUDA device is visible to torch {torch.__version__} (CUDA build: '
                f'{torch.version.cuda or "none"}); run this on a machine with an NVIDIA GPU')
    if not _backend.HAS_TRITON:
        return 'triton is not importable, so the kernels cannot be checked'
    if _backend.TRITON_INTERPRET:
        return 'TRITON_INTERPRET is set: unset it so the kernels are compiled for the GPU'
    return ''


# -- step 1: kernels vs references at realistic sizes --
#: ``(name, make(device, dtype) -> Example)``: each op's ``spec.example`` at its
#: ``spec.gpu_sizes`` (the backbones' first stage at 224, batch 8, and 512 or more, batch 2)
KERNEL_CASES: List[Tuple[str, Callable[[Any, Any], Any]]] = [
    (kernels.case_name(spec.name, sizes), functools.partial(spec.example, **sizes))
    for spec in SPECS for sizes in spec.gpu_sizes]


def gpu_name(device) -> str:
    """The ``kernels.PEAKS`` entry closest to ``device`` (H200 or else H100)."""
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else ''
    return 'H200' if 'H200' in name else 'H100'


def time_call(fn: Callable, inputs: List[Any], backend: str, reps: int = 20) -> float:
    """Median seconds of one forward + backward of ``fn(backend, *inputs)``, after 3 warm-ups."""
    xs = [x.detach().requires_grad_() for x in inputs]
    grad = torch.ones_like(fn(backend, *xs))

    def step() -> None:
        fn(backend, *xs).backward(grad)

    for _ in range(3):
        step()
    return median([time_once(step, xs[0].device) for _ in range(reps)])


def check_kernels(out_dir: str, device: str = 'cuda', backend: str = 'triton',
                  dtypes: Tuple[str, ...] = ('float32', 'bfloat16'),
                  only: str = '', timing: Optional[bool] = None,
                  first_per_op: bool = False) -> Dict[str, Any]:
    """``backend`` (``'reference'``: this harness itself, on a CPU) in each of ``dtypes`` against
    the fp64 reference, output and input gradients; ``only``: cases whose name contains it;
    ``first_per_op``: each op's first case; ``timing`` (default: on CUDA): measured next to
    predicted."""
    device = torch.device(device)
    timing = device.type == 'cuda' if timing is None else timing
    rows = []
    ops_seen = set()
    for name, make in KERNEL_CASES:
        op = name.split()[0]
        if only not in name or (first_per_op and op in ops_seen):
            continue
        ops_seen.add(op)
        for dtype in (getattr(torch, d) for d in dtypes):
            row = dict(case=name, dtype=str(dtype).replace('torch.', ''))
            t0 = time.time()
            try:
                torch.manual_seed(0)
                fn, inputs = make(device, dtype)[:2]
                xs = [x.detach().clone().requires_grad_() for x in inputs]
                out = fn(backend, *xs)
                grad = torch.randn_like(out, dtype=torch.float32).to(out.dtype)
                out.backward(grad)
                refs = [x.detach().double().requires_grad_() for x in inputs]
                ref = fn('reference', *refs)
                ref.backward(grad.double())
                tol = next((s.tolerances for s in SPECS if s.name == op), DEFAULT_TOLERANCES)
                check_close(out, ref, dtype, 'output', tol)
                for i, (x, r) in enumerate(zip(xs, refs)):
                    if r.grad is not None:
                        assert x.grad is not None, f'input {i}: no gradient from the kernels'
                        check_close(x.grad, r.grad, dtype, f'grad of input {i}', tol)
                row['status'] = 'ok'
                roof = kernels.ROOFLINES.get(name)
                if roof is not None and timing:  # measured next to predicted (fwd + bwd)
                    dname = {'float32': 'fp32', 'bfloat16': 'bf16'}.get(row['dtype'])
                    if dname is not None:
                        total = kernels.total_cost(roof.costs(dname))
                        gpu = gpu_name(device)
                        row['measured_us'] = round(time_call(fn, inputs, backend) * 1e6, 1)
                        row['predicted_us'] = round(
                            kernels.predicted_seconds(total, gpu, dname) * 1e6, 1)
                        row['predicted_for'] = gpu
                        row['roofline_fraction'] = round(row['predicted_us']
                                                         / max(row['measured_us'], 1e-3), 3)
            except Exception as e:
                row['status'] = 'FAIL'
                row['error'] = f'{type(e).__name__}: {e}'[:2000]
            row['seconds'] = round(time.time() - t0, 2)
            rows.append(row)
            shown = (f' measured {row["measured_us"]} us, predicted {row["predicted_us"]} us '
                     f'({row["predicted_for"]} roofline; {row["roofline_fraction"]:.0%})'
                     if 'measured_us' in row else '')
            print(f'  {row["status"]:4} {name} [{row["dtype"]}]{shown} '
                  f'{row.get("error", "")[:200]}', flush=True)
            if device.type == 'cuda':
                torch.cuda.empty_cache()
    write_outputs(out_dir, {'kernels.json': rows})
    failed = [r for r in rows if r['status'] != 'ok']
    return dict(status='ok' if not failed else 'FAIL', checked=len(rows), failed=len(failed))


def summary_markdown(summary: Dict[str, Any], out_dir: str) -> str:
    """``gpu_check.md``: the steps, the kernels' check and the official-operator comparison (the
    benchmarks write their own tables)."""
    env = summary['environment']
    where = 'dry run on the CPU (plumbing only)' if summary['dry_run'] else env.get('gpu', 'GPU')
    lines = [f'# gpu_check: {where}', '',
             f'{env["time"]}; torch {env["torch"]}, Triton {env.get("triton_version", "none")}, '
             f'Python {env["python"]}' + (f', compute capability {env["capability"]}'
                                          if 'capability' in env else '') + '.', '',
             *md_table(['step', 'status', 'seconds'], [
                 [name, summary[name]['status'], summary[name]['seconds']]
                 for name in summary['steps'] if name in summary], 'llr')]

    def table(file: str, title: str, header: List[str], row: Callable[[dict], List[Any]]):
        path = osp.join(out_dir, file)
        if not osp.isfile(path):
            return
        with open(path) as f:
            data = json.load(f)
        rows = data['rows'] if isinstance(data, dict) else data
        lines.extend(['', f'## {title}', ''] + md_table(header, map(row, rows)))

    table('kernels.json', 'Kernels against the fp64 reference (forward + backward)',
          ['case', 'dtype', 'status', 'measured µs', 'predicted µs', 'of roofline', 'error'],
          lambda r: [r['case'], r['dtype'], r['status'], r.get('measured_us'),
                     r.get('predicted_us') and f'{r["predicted_us"]} ({r["predicted_for"]})',
                     r.get('roofline_fraction') and f'{r["roofline_fraction"]:.0%}',
                     r.get('error', '')[:120]])
    table('official_kernels.json', "Against LaplacianFormer's official CUDA operators",
          ['case', 'dtype', 'fwd ms ours / official', 'fwd+bwd ms ours / official',
           'output diff', 'error'],
          lambda r: [r['case'], r['dtype']] + [
              f'{r[f"{m}_ms"]["ours"]:.3f} / {r[f"{m}_ms"]["official"]:.3f} '
              f'({r[f"{m}_ratio"]:.2f}x)' if f'{m}_ms' in r else None
              for m in ('fwd', 'fwd_bwd')] + [r.get('output_diff') and f'{r["output_diff"]:.1e}',
                                              r.get('error', '')[:120]])
    return '\n'.join(lines) + '\n'


# -- steps 2-4: subprocesses --
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


def step_commands(args: argparse.Namespace) -> Dict[str, List[str]]:
    """The command of each subprocess step (``--dry-run``: on the CPU, at smoke sizes)."""
    py = sys.executable
    # tests/ops/test_aot.py compiles for sm_80/sm_90 on the CPU: CI's work, not the GPU's
    op_tests = [py, '-m', 'pytest', 'tests/ops', '-q', '-p', 'no:cacheprovider',
                '--ignore', 'tests/ops/test_aot.py']
    if importlib.util.find_spec('xdist') is not None and not args.dry_run:
        op_tests += ['-n', '4']  # a dry run's few tests cost less than starting workers
    ops = [py, 'tools/benchmark_ops.py', '--out-dir', osp.join(args.out_dir, 'ops')]
    backbones = [py, 'tools/benchmark.py', '--out-dir', osp.join(args.out_dir, 'backbones'),
                 '--dtype', 'bf16' if args.bf16 else 'fp32']
    if args.dry_run:
        op_tests += ['-k', 'gradcheck']
        ops += ['--preset', 'smoke', '--device', 'cpu', '--tokens', '196']
        # every model, forward and backward once (no FLOP count, as the gpu preset)
        backbones += ['--preset', 'smoke', '--device', 'cpu', '--models', 'all',
                      '--sizes', '64', '--repeats', '1', '--warmup', '0', '--no-flops']
    else:
        ops += ['--preset', 'gpu']
        backbones += ['--preset', 'gpu']
    commands = dict(op_tests=op_tests, benchmark_ops=ops, benchmark=backbones)
    if args.laplacianformer_root:
        commands['official_kernels'] = [
            py, 'tools/analysis_tools/compare_official_kernels.py', '--laplacianformer-root',
            args.laplacianformer_root, '--json', osp.join(args.out_dir, 'official_kernels.json')]
    return commands


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = '' if args.dry_run else cuda_problem()
    if problem:
        print(f'gpu_check: cannot run: {problem}', file=sys.stderr)
        return NO_CUDA_EXIT
    os.makedirs(args.out_dir, exist_ok=True)
    commands = step_commands(args)
    limits = {**STEP_LIMITS, **OPTIONAL_STEP_LIMITS}
    # a dry run checks the references on the CPU (the harness, not the kernels), at each op's
    # smaller size
    kernel_kwargs = dict(device='cpu', backend='reference', dtypes=('float32', ),
                         first_per_op=True) if args.dry_run else {}
    steps = {'kernels': lambda: check_kernels(args.out_dir, **kernel_kwargs),
             **{name: (lambda name=name: run_step(name, commands[name], args.out_dir,
                                                   limits[name]))
                for name in commands}}
    # written after every step, so a run cut short still leaves what it finished
    summary: Dict[str, Any] = dict(
        dry_run=args.dry_run, steps=args.steps,
        environment=environment(torch.device('cpu' if args.dry_run else 'cuda'), torch.float32))
    t_all = time.time()
    for name in args.steps:
        print(f'[{name}] (limit {limits[name]} s)', flush=True)
        t0 = time.time()
        try:
            summary[name] = steps[name]()
        except Exception as e:
            summary[name] = dict(status='FAIL', error=f'{type(e).__name__}: {e}',
                                 traceback=traceback.format_exc()[-3000:])
        summary[name]['seconds'] = round(time.time() - t0, 1)
        summary['total_seconds'] = round(time.time() - t_all, 1)
        write_outputs(args.out_dir, {'gpu_check.json': summary,
                                     'gpu_check.md': summary_markdown(summary, args.out_dir)})
        print(f'[{name}] {summary[name]["status"]} in {summary[name]["seconds"]} s', flush=True)
    ok = all(summary[name]['status'] == 'ok' for name in args.steps)
    print(f'gpu_check: {"all steps passed" if ok else "FAILURES"}; '
          f'{args.out_dir}/gpu_check.json ({summary["total_seconds"]} s)')
    return 0 if ok else 1

if __name__ == '__main__':
    sys.exit(main())
