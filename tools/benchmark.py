#!/usr/bin/env python
"""Benchmark backbones side by side: latency, throughput, peak memory, parameters and FLOPs.

    python tools/benchmark.py --preset readme --out-dir work_dirs/benchmark
    python tools/benchmark.py --models SEMA-T MILA-T Swin-T --sizes 224 1024 512x768
    python tools/benchmark.py --models ours Swin-T --sizes 512 1024 --compile --onnx

A command line over :func:`mmeffattn.analysis.benchmarking.run_benchmark` (the models of
:mod:`mmeffattn.analysis.model_zoo`, random weights, interleaved within each size). Writes
``benchmark.json``, ``benchmark.md`` (ratios to ``--reference``) and log-log plots of latency and
memory against tokens under ``--out-dir``; ``benchmark.partial.json`` after each size.
"""
import argparse
import dataclasses
import os
import os.path as osp
from typing import Any, Dict, List

import torch

from mmeffattn.analysis.benchmarking import (PEER_LAYOUTS, PRESETS, BenchmarkSettings,
                                             run_benchmark)
from mmeffattn.analysis.report import fmt, md_table, pyplot, save_figure, write_outputs

VARIANTS = dict(compiled=('compile', 'compiled'), ort=('onnx', 'onnxruntime'))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--preset', choices=sorted(PRESETS), default='readme')
    p.add_argument('--models', nargs='+', help="names, or 'ours'/'peers'/'all' (preset's)")
    p.add_argument('--sizes', nargs='+', help='N (square) or HxW, e.g. 224 512x768')
    p.add_argument('--batch', type=int, help='images per forward (images/s = batch / latency)')
    p.add_argument('--warmup', type=int)
    p.add_argument('--repeats', type=int, help='timed runs per model and size (median kept)')
    p.add_argument('--backward-max-side', type=int,
                   help='time forward+backward only up to this image side')
    p.add_argument('--budget-s', type=float, help='measurement seconds per model, all sizes')
    p.add_argument('--max-call-s', type=float,
                   help='skip a size whose one forward is predicted to take longer')
    p.add_argument('--max-memory-gb', type=float,
                   help='skip a size whose peak memory is predicted to exceed this')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--dtype', choices=['fp32', 'bf16'], default='fp32',
                   help='bf16 runs under autocast (CPU or CUDA)')
    p.add_argument('--threads', type=int, help='torch.set_num_threads (CPU), and '
                   "onnxruntime's intra-op threads")
    p.add_argument('--ops-backend', choices=['auto', 'torch', 'reference', 'triton'],
                   help="backend of mmeffattn's ops (default: Triton on CUDA, torch on a CPU)")
    p.add_argument('--reference', help='model the ratios are taken against (default: Swin-T, '
                   "the preset's)")
    p.add_argument('--peer-layout', choices=PEER_LAYOUTS, default='channels-last',
                   help="the peers' memory format (ours run as built, fed NCHW)")
    p.add_argument('--no-flops', action='store_true', default=None,
                   help='skip the FLOP count (one traced forward per model and size)')
    p.add_argument('--no-plots', action='store_true')
    p.add_argument('--compile', action='store_true',
                   help='also time each model under torch.compile (one static graph per size), '
                        'back to back with eager')
    p.add_argument('--compile-backend', default='inductor',
                   help="torch.compile backend of --compile ('aot_eager' to check the path)")
    p.add_argument('--compile-mode', help="torch.compile mode (e.g. 'max-autotune')")
    p.add_argument('--freezing', action='store_true',
                   help="inductor's freezing for --compile (weights folded as constants)")
    p.add_argument('--onnx', action='store_true',
                   help='also time each model exported to ONNX (static, per size) under '
                        "onnxruntime's CPU provider, back to back with eager (fp32, CPU)")
    p.add_argument('--out-dir', default='work_dirs/benchmark')
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.reference is None:
        args.reference = 'Swin-T'
    args.no_flops = bool(args.no_flops)
    return args


def run(args: argparse.Namespace) -> Dict[str, Any]:
    return run_benchmark(BenchmarkSettings(**{f.name: getattr(args, f.name)
                                              for f in dataclasses.fields(BenchmarkSettings)}))


def markdown(report: Dict[str, Any]) -> str:
    """Tables per size (with ratios to the reference model), eager against the compiled and
    onnxruntime forwards, and the fitted exponents."""
    env, settings = report['environment'], report['settings']
    ref = settings['reference']
    where = env.get('gpu', env['processor'])
    threads = f'{env["threads"]} thread' + ('s' if env['threads'] != 1 else '')
    peers = 'in channels-last memory format (model and input)' if \
        settings.get('peer_layout') == 'channels-last' else 'as built'
    lines = [f'Device: {env["device"]} ({where}), {threads}, {env["dtype"]}, '
             f'batch {settings["batch"]}, torch {env["torch"]}; median of '
             f'{settings["repeats"]} runs after {settings["warmup"]} warm-up; models '
             f'interleaved; ops backend {settings.get("ops_backend", "auto")}. Setting: ours '
             f'as built (a config\'s backbone fed a plain NCHW batch), the peers '
             f'{peers}; every model under the same dtype and compile options. Memory: '
             f'{env["memory_method"]}. FLOPs: '
             f'GMACs per image. Ratios: latency and memory relative to {ref}.', '']
    sizes = list(dict.fromkeys(tuple(r['size']) for r in report['results']))
    for hw in sizes:
        rows = [r for r in report['results'] if tuple(r['size']) == hw]
        base = next((r for r in rows if r['model'] == ref and r['fwd_ms'] is not None), None)
        cells = []
        for r in rows:
            head = [r['model'], r.get('setting', 'as built'), fmt(r['params_m'])]
            if r['fwd_ms'] is None:
                cells.append(head + [r['status']] + [''] * 6)
                continue
            ratio_t = r['fwd_ms'] / base['fwd_ms'] if base else None
            ratio_m = (r['peak_mem_mb'] / base['peak_mem_mb']
                       if base and base['peak_mem_mb'] and r['peak_mem_mb'] else None)
            cells.append(head + [fmt(r['gmacs'], 2), fmt(r['fwd_ms']), fmt(r['fwd_bwd_ms']),
                                 fmt(r['images_per_s'], 2), fmt(r['peak_mem_mb'], 0),
                                 f'{fmt(ratio_t, 2)}x', f'{fmt(ratio_m, 2)}x'])
        lines += [f'### {hw[0]}x{hw[1]} ({rows[0]["tokens"]} tokens of 16x16)', ''] + md_table(
            ['model', 'setting', 'params (M)', 'GMACs', 'fwd (ms)', 'fwd+bwd (ms)', 'img/s',
             'peak mem (MB)', 'fwd vs ref', 'mem vs ref'], cells, 'llrrrrrrrr') + ['']
    lines += variants_table(report)
    exps = [[n, report['models'][n]['attention'], fmt(k['latency'], 2), fmt(k['memory'], 2),
             fmt(k['flops'], 2)] for n, k in report['exponents'].items()]
    lines += ['### Scaling exponents (y ~ tokens^k over the square sizes)', ''] + md_table(
        ['model', 'attention', 'latency k', 'memory k', 'FLOPs k'], exps, 'llrrr')
    lines += ['', f'Total run time: {report["elapsed_s"]:.0f} s.']
    return '\n'.join(lines) + '\n'


def variants_table(report: Dict[str, Any]) -> List[str]:
    """Eager, compiled and onnxruntime forwards timed back to back in the same rounds; the
    speed-up is eager / variant (> 1: faster than eager)."""
    settings = report['settings']
    on = [(v, label) for v, (key, label) in VARIANTS.items() if settings.get(key)]
    if not on:
        return []
    version = dict(ort=f' {report["environment"].get("onnxruntime")}', compiled='')
    lines = ['### ' + ' and '.join(f'{label}{version[v]} ({settings[VARIANTS[v][0]]})'
                                   for v, label in on) + ' against eager, forward', '',
             'Timed back to back with eager in the same rounds; speed-up = eager / variant; '
             'setup: compiling, or exporting and opening the session; rel. error: largest '
             "|ORT - eager| over the largest |eager| of the outputs.", '']
    header = ['model', 'setting', 'size', 'eager (ms)'] + [
        h for _, label in on for h in (f'{label} (ms)', 'speed-up', 'setup (s)')] + (
        ['rel. error'] if settings.get('onnx') else [])
    rows = []
    for r in report['results']:
        timed = [v for v, _ in on if r.get(f'fwd_{v}_ms') is not None]
        if not timed and not any(r.get(f'{v}_status') for v, _ in on):
            continue
        eager = r[f'fwd_{timed[0]}_ms'] * r[f'{timed[0]}_speedup'] if timed else None
        cells = []
        for v, _ in on:
            if r.get(f'fwd_{v}_ms') is None:
                cells += [r.get(f'{v}_status') or '-', '', '']
            else:
                cells += [fmt(r[f'fwd_{v}_ms']), f'{r[f"{v}_speedup"]:.2f}x',
                          fmt(r[f'{v}_setup_s'], 0)]
        if settings.get('onnx'):
            cells.append('-' if r.get('ort_rel_err') is None else f'{r["ort_rel_err"]:.1e}')
        rows.append([r['model'], r.get('setting', 'as built'), f'{r["size"][0]}x{r["size"][1]}',
                     fmt(eager)] + cells)
    return lines + md_table(header, rows, 'lllr' + 'r' * (len(header) - 4)) + ['']


def plot(report: Dict[str, Any], out_dir: str) -> List[str]:
    """Log-log latency and memory against tokens, one line per model, exponent in the legend."""
    plt = pyplot()
    files = []
    for col, key, label, fname in (('fwd_ms', 'latency', 'forward latency (ms)',
                                    'latency_vs_tokens.png'),
                                   ('peak_mem_mb', 'memory', 'peak memory (MB)',
                                    'memory_vs_tokens.png')):
        fig, ax = plt.subplots(figsize=(7, 5))
        for name, ks in report['exponents'].items():
            rows = [r for r in report['results'] if r['model'] == name and
                    r['size'][0] == r['size'][1] and r[col] is not None]
            if not rows:
                continue
            k = ks[key]
            ours = report['models'][name]['ours']
            ax.plot([r['tokens'] for r in rows], [r[col] for r in rows],
                    '-o' if ours else '--s', markersize=4,
                    label=f'{name} (k={k:.2f})' if k is not None else name)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('tokens (16x16 patches of the input)')
        ax.set_ylabel(label)
        env = report['environment']
        ax.set_title(f'{label} on {env.get("gpu", env["processor"])}, batch '
                     f'{report["settings"]["batch"]}, {env["dtype"]}, peers '
                     f'{report["settings"].get("peer_layout", "as-built")}', fontsize=9)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        files.append(save_figure(fig, osp.join(out_dir, fname)))
    return files


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    report = run(args)
    write_outputs(args.out_dir, {'benchmark.json': report, 'benchmark.md': markdown(report)})
    if not args.no_plots:
        report['plots'] = plot(report, args.out_dir)
    print(f'wrote {args.out_dir}/benchmark.json, benchmark.md'
          + ('' if args.no_plots else ', latency_vs_tokens.png, memory_vs_tokens.png')
          + f' ({report["elapsed_s"]:.0f} s)')
    return report


if __name__ == '__main__':
    main()
