#!/usr/bin/env python
"""The attention-zoo table: every token mixer in the same SEMA-T pyramid, side by side.

    python tools/analysis_tools/zoo_table.py --out-dir docs/perf [--sizes 224 512 1024]

Two measurements of the library, run on the zoo's models (``configs/zoo``, ``Zoo-<attn_type>``
in :mod:`mmeffattn.analysis.model_zoo`):

- the benchmark's ``zoo`` preset (``tools/benchmark.py --preset zoo``): parameters, FLOPs (MACs,
  ``count_flops``), forward latency and peak memory per input size; a size whose predicted time
  or memory exceeds the preset's limits is reported as skipped (global softmax, quadratic, at
  large sizes);
- attention dispersion (:mod:`mmeffattn.analysis.dispersion`, as ``tools/analyze_dispersion.py``:
  the first block's own q/k, the implied attention weights of the model's own kind): entropy /
  log N and effective keys ``exp(H)``. The core-periphery mixer is measured with its learned
  cores (projected by its own q/k); the dynamic mixer has no attention weights (``n/a``).

Writes ``zoo.json`` and ``zoo.md`` (the README table) under ``--out-dir``.
"""
import argparse
import json
import os
import os.path as osp
from typing import Any, Dict, List, Optional

import torch

from mmeffattn.analysis import dispersion as dsp
from mmeffattn.analysis.benchmarking import PRESETS, BenchmarkSettings, parse_size, run_benchmark

#: attn_type -> kind of mmeffattn.analysis.dispersion (None: no attention weights)
DISPERSION_KIND = {'sema': 'sema', 'linear': 'linear', 'window': 'window', 'softmax': 'softmax',
                   'laplacian': 'laplacian_nystrom', 'core_periphery': 'core_periphery',
                   'dynamic': None}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--sizes', nargs='+', default=['224', '512', '1024'])
    p.add_argument('--models', nargs='+', help='Zoo-<attn_type> names (default: the whole zoo)')
    p.add_argument('--repeats', type=int, help="timed runs (the 'zoo' preset's by default)")
    p.add_argument('--budget-s', type=float, help='benchmark seconds per model')
    p.add_argument('--max-call-s', type=float, help='skip a size predicted to take longer')
    p.add_argument('--max-queries', type=int, default=256, help='dispersion: queries per size')
    p.add_argument('--no-dispersion', action='store_true')
    p.add_argument('--out-dir', default='work_dirs/zoo')
    return p.parse_args(argv)


def benchmark(args: argparse.Namespace) -> Dict[str, Any]:
    """The benchmark's 'zoo' preset on ``args.sizes`` (and the other options given)."""
    settings = BenchmarkSettings(**dict(PRESETS['zoo'], preset='zoo', sizes=args.sizes,
                                        device='cuda' if torch.cuda.is_available() else 'cpu'))
    for key in ('models', 'repeats', 'budget_s', 'max_call_s'):
        if getattr(args, key) is not None:
            setattr(settings, key, getattr(args, key))
    return run_benchmark(settings)


def dispersion(name: str, sizes: List[str], max_queries: int) -> List[Dict[str, Any]]:
    """Entropy and effective keys of ``name``'s own attention kind at its first block."""
    from mmeffattn.analysis.model_zoo import build_backbone, get_model
    kind = DISPERSION_KIND[get_model(name).attention]
    if kind is None:
        return []
    torch.manual_seed(0)
    model = build_backbone(name)
    layer, attn = dsp.find_attention(model, 'layers.0.blocks.0.attn')
    rows = []
    for size in sizes:
        hw_img = parse_size(size)
        got = dsp.capture(model, attn, torch.randn(1, 3, *hw_img), stop=True)
        hw, _ = dsp.layer_grid(got, hw_img, 4)
        with torch.no_grad():
            q, k = dsp.project_qk(attn, got['x'])
            cores = None
            if kind == 'core_periphery':  # the mixer's own learned cores
                cores = dsp.project_qk(attn, attn.cores.detach())
        sample = dsp.sample_queries(q.shape[2], max_queries, 0)
        w = dsp.implied_weights(kind, q.float(), k.float(), hw, sample, window=model.window_size,
                                cores=cores)
        stats = dsp.dispersion_stats(w)
        rows.append(dict(size=list(hw_img), grid=list(hw), kind=kind, layer=layer, **stats))
        print(f'[dispersion] {name} {size}: entropy/logN {stats["normalized_entropy"]:.3f}, '
              f'effective keys {stats["effective_keys"]:.1f}', flush=True)
    return rows


def _fmt(v: Optional[float], digits: int = 1) -> str:
    return '-' if v is None else f'{v:,.{digits}f}'


def markdown(report: Dict[str, Any]) -> str:
    bench = report['benchmark']
    env, settings = bench['environment'], bench['settings']
    sizes = [tuple(s) for s in settings['sizes']]
    names = list(bench['models'])
    head = ' | '.join(f'{h}x{w} {col}' for h, w in sizes for col in ('GMACs', 'ms', 'MB'))
    threads = f'{env["threads"]} thread' + ('s' if env['threads'] != 1 else '')
    lines = [
        'Attention zoo: SEMA-T (stem, 4 stages [2, 4, 8, 4], gated Mamba-like blocks, MLP) with '
        'only the token mixer changed. Random weights, batch 1, '
        f'{env["device"]} ({env.get("gpu", env["processor"])}), {threads}, '
        f'{env["dtype"]}, ops backend {settings["ops_backend"]}; forward latency = median of '
        f'{settings["repeats"]} runs after {settings["warmup"]} warm-up (models interleaved); '
        f'peak memory: {env["memory_method"]}; GMACs per image (count_flops). A size whose '
        f'predicted forward exceeds {settings["max_call_s"]} s or '
        f'{settings["max_memory_gb"]} GB, or the model\'s {settings["budget_s"]:.0f} s budget, '
        'is skipped (the cell says so).', '',
        f'| attn_type | params (M) | {head} |',
        '|---|---:|' + '---:|' * (3 * len(sizes))]
    for name in names:
        cells = []
        for hw in sizes:
            r = next(r for r in bench['results'] if r['model'] == name and tuple(r['size']) == hw)
            if r['fwd_ms'] is None:
                cells += [r['status'], '', '']
            else:
                cells += [_fmt(r['gmacs'], 2), _fmt(r['fwd_ms']), _fmt(r['peak_mem_mb'], 0)]
        attn = bench['models'][name]['attention']
        lines.append(f'| {attn} | {_fmt(bench["models"][name]["params_m"], 2)} | '
                     + ' | '.join(cells) + ' |')
    disp = report.get('dispersion')
    if disp:
        lines += ['', 'Dispersion of each mixer\'s own attention weights at its first block '
                  '(mmeffattn.analysis.dispersion; random init, so this shows the '
                  'structure of each kind, not trained behaviour; up to '
                  f'{report["max_queries"]} sampled queries): entropy / log N and effective '
                  'keys exp(H).', '',
                  '| attn_type | kind | ' + ' | '.join(f'{h}x{w} H/logN | {h}x{w} eff. keys'
                                                      for h, w in sizes) + ' |',
                  '|---|---|' + '---:|' * (2 * len(sizes))]
        for name in names:
            rows = disp.get(name) or []
            attn = bench['models'][name]['attention']
            if name in report.get('dispersion_errors', {}):
                lines.append(f'| {attn} | error: {report["dispersion_errors"][name]} |'
                             + ' |' * (2 * len(sizes)))
                continue
            if not rows:
                lines.append(f'| {attn} | n/a (no attention weights) |' + ' |' * (2 * len(sizes)))
                continue
            by_size = {tuple(r['size']): r for r in rows}
            cells = []
            for hw in sizes:
                r = by_size.get(hw)
                cells += ['-', '-'] if r is None else [f'{r["normalized_entropy"]:.3f}',
                                                       _fmt(r['effective_keys'])]
            lines.append(f'| {attn} | {rows[0]["kind"]} | ' + ' | '.join(cells) + ' |')
    lines += ['', f'Benchmark run time: {bench["elapsed_s"]:.0f} s.']
    return '\n'.join(lines) + '\n'


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    report: Dict[str, Any] = dict(benchmark=benchmark(args), max_queries=args.max_queries)
    if not args.no_dispersion:
        report['dispersion'], report['dispersion_errors'] = {}, {}
        for name in report['benchmark']['models']:
            try:
                report['dispersion'][name] = dispersion(name, args.sizes, args.max_queries)
            except Exception as e:  # one model's failure must not lose the table
                print(f'[dispersion] {name}: {type(e).__name__}: {e}', flush=True)
                report['dispersion_errors'][name] = f'{type(e).__name__}: {e}'
    with open(osp.join(args.out_dir, 'zoo.json'), 'w') as f:
        json.dump(report, f, indent=1)
    with open(osp.join(args.out_dir, 'zoo.md'), 'w') as f:
        f.write(markdown(report))
    print(f'wrote {args.out_dir}/zoo.json, zoo.md')
    return report


if __name__ == '__main__':
    main()
