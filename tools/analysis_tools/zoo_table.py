#!/usr/bin/env python
"""The attention-zoo table: every token mixer in the same SEMA-T pyramid, side by side.

    python tools/analysis_tools/zoo_table.py --out-dir docs/perf [--sizes 224 512 1024]

On the zoo's models (``Zoo-<attn_type>`` of :mod:`mmeffattn.analysis.model_zoo`): the
benchmark's ``zoo`` preset (parameters, MACs, forward latency and peak memory per size; sizes
past the preset's limits are skipped) and the dispersion of each mixer's own attention weights at
its first block (:mod:`mmeffattn.analysis.dispersion`; the dynamic mixer has none). Writes
``zoo.json`` and ``zoo.md`` (the README table) under ``--out-dir``.
"""
import argparse
from typing import Any, Dict, List

import torch

from mmeffattn.analysis import dispersion as dsp
from mmeffattn.analysis.benchmarking import PRESETS, BenchmarkSettings, parse_size, run_benchmark
from mmeffattn.analysis.report import fmt, md_table, write_outputs

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


def markdown(report: Dict[str, Any]) -> str:
    bench = report['benchmark']
    env, settings = bench['environment'], bench['settings']
    sizes = [tuple(s) for s in settings['sizes']]
    names = list(bench['models'])
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
        'is skipped (the cell says so).', '']
    rows = []
    for name in names:
        cells = []
        for hw in sizes:
            r = next(r for r in bench['results'] if r['model'] == name and tuple(r['size']) == hw)
            if r['fwd_ms'] is None:
                cells += [r['status'], '', '']
            else:
                cells += [fmt(r['gmacs'], 2), fmt(r['fwd_ms']), fmt(r['peak_mem_mb'], 0)]
        rows.append([bench['models'][name]['attention'],
                     fmt(bench['models'][name]['params_m'], 2)] + cells)
    lines += md_table(['attn_type', 'params (M)'] + [f'{h}x{w} {col}' for h, w in sizes
                                                     for col in ('GMACs', 'ms', 'MB')],
                      rows, 'lr' + 'r' * 3 * len(sizes))
    disp = report.get('dispersion')
    if disp:
        lines += ['', 'Dispersion of each mixer\'s own attention weights at its first block '
                  '(mmeffattn.analysis.dispersion; random init, so this shows the '
                  'structure of each kind, not trained behaviour; up to '
                  f'{report["max_queries"]} sampled queries): entropy / log N and effective '
                  'keys exp(H).', '']
        rows = []
        for name in names:
            attn, got = bench['models'][name]['attention'], disp.get(name) or []
            error = report.get('dispersion_errors', {}).get(name)
            if error or not got:
                rows.append([attn, f'error: {error}' if error else 'n/a (no attention weights)']
                            + [''] * (2 * len(sizes)))
                continue
            by_size, cells = {tuple(r['size']): r for r in got}, [attn, got[0]['kind']]
            for r in (by_size.get(hw) for hw in sizes):
                cells += ['-', '-'] if r is None else [f'{r["normalized_entropy"]:.3f}',
                                                       fmt(r['effective_keys'])]
            rows.append(cells)
        lines += md_table(['attn_type', 'kind'] + [f'{h}x{w} {c}' for h, w in sizes
                                                   for c in ('H/logN', 'eff. keys')],
                          rows, 'll' + 'r' * 2 * len(sizes))
    lines += ['', f'Benchmark run time: {bench["elapsed_s"]:.0f} s.']
    return '\n'.join(lines) + '\n'


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    report: Dict[str, Any] = dict(benchmark=benchmark(args), max_queries=args.max_queries)
    if not args.no_dispersion:
        report['dispersion'], report['dispersion_errors'] = {}, {}
        for name in report['benchmark']['models']:
            try:
                report['dispersion'][name] = dispersion(name, args.sizes, args.max_queries)
            except Exception as e:  # one model's failure must not lose the table
                print(f'[dispersion] {name}: {type(e).__name__}: {e}', flush=True)
                report['dispersion_errors'][name] = f'{type(e).__name__}: {e}'
    write_outputs(args.out_dir, {'zoo.json': report, 'zoo.md': markdown(report)})
    print(f'wrote {args.out_dir}/zoo.json, zoo.md')
    return report


if __name__ == '__main__':
    main()
