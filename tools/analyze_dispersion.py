#!/usr/bin/env python
"""Attention dispersion against token count: SEMA's argument, measured on a backbone's own q/k.

    python tools/analyze_dispersion.py --model SEMA-T --sizes 224 512 1024 \
        [--checkpoint ckpt.pth] --out-dir work_dirs/dispersion

The backbone (random weights, or ``--checkpoint``) runs once per size; the tokens entering one
attention layer (``--layer``), projected by its own q/k weights, are weighed by every kind of
:mod:`mmeffattn.analysis.dispersion` on up to ``--max-queries`` queries. Writes
``dispersion.json``, ``dispersion.md`` and ``dispersion.png``.
"""
import argparse
import os.path as osp
from typing import Any, Dict, List

import torch

from mmeffattn.analysis.report import md_table, pyplot, save_figure, write_outputs


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--model', default='SEMA-T', help='a name of mmeffattn.analysis.model_zoo')
    p.add_argument('--checkpoint', help='weights for the backbone (a classifier or detector '
                   "checkpoint works: a 'backbone.' prefix is stripped); default: random")
    p.add_argument('--sizes', nargs='+', default=['224', '512', '1024'])
    p.add_argument('--layer', help='dotted name of the attention module (default: the first '
                   'module with num_heads and a q/k projection)')
    p.add_argument('--kinds', nargs='+', help='attention kinds (default: every available one)')
    p.add_argument('--max-queries', type=int, default=256)
    p.add_argument('--window', type=int, default=7)
    p.add_argument('--num-cores', type=int, default=16,
                   help='pooled cores for core_periphery when the model is not VECA')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out-dir', default='work_dirs/dispersion')
    p.add_argument('--no-plot', action='store_true')
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from mmeffattn.analysis import dispersion as dsp
    from mmeffattn.analysis.benchmarking import parse_size
    from mmeffattn.analysis.model_zoo import build_backbone
    torch.manual_seed(args.seed)
    model = build_backbone(args.model)
    if args.checkpoint:
        from mmengine.runner import load_checkpoint

        from mmeffattn.engine.runner_setup import prepare_runtime
        prepare_runtime()  # our Runner's checkpoints load under torch's weights-only loader
        load_checkpoint(model, args.checkpoint, map_location='cpu',
                        revise_keys=[(r'^module\.', ''), (r'^backbone\.', '')])
    kinds = args.kinds or list(dsp.KINDS)
    bad = set(kinds) - set(dsp.KINDS)
    if bad:
        raise SystemExit(f'unknown --kinds {sorted(bad)}; choose from {dsp.KINDS}')
    layer, attn = dsp.find_attention(model, args.layer)
    patch = getattr(model, 'patch_size', 16)
    rows: List[Dict[str, Any]] = []
    for size in args.sizes:
        hw_img = parse_size(size)
        got = dsp.capture(model, attn, torch.randn(1, 3, *hw_img))
        hw, cores = dsp.layer_grid(got, hw_img, patch)
        q, k = dsp.project_qk(attn, got['x'])
        core_qk = None
        if cores:  # VECA: its own cores, and the patches alone as the grid
            core_qk = (q[:, :, :cores], k[:, :, :cores])
            q, k = q[:, :, cores:], k[:, :, cores:]
        N = q.shape[2]
        sample = dsp.sample_queries(N, args.max_queries, args.seed)
        for kind in kinds:
            w = dsp.implied_weights(kind, q.float(), k.float(), hw, sample, window=args.window,
                                    num_cores=args.num_cores, cores=core_qk)
            stats = dsp.dispersion_stats(w)
            rows.append(dict(size=list(hw_img), grid=list(hw), kind=kind, queries=len(sample),
                             **stats))
            print(f'{hw_img[0]}x{hw_img[1]} N={N:>6} {kind:>17}: entropy/logN '
                  f'{stats["normalized_entropy"]:.3f}, max weight {stats["max_weight"]:.4f}, '
                  f'effective keys {stats["effective_keys"]:.1f}', flush=True)
    return dict(model=args.model, checkpoint=args.checkpoint or 'random init', layer=layer,
                max_queries=args.max_queries, seed=args.seed, window=args.window,
                results=rows)


def markdown(report: Dict[str, Any]) -> str:
    rows = [[f'{r["size"][0]}x{r["size"][1]}', r['tokens'], r['kind'],
             f'{r["normalized_entropy"]:.3f}', f'{r["max_weight"]:.4f}',
             f'{r["effective_keys"]:.1f}', f'{r["effective_fraction"]:.4f}']
            for r in report['results']]
    lines = [f'{report["model"]} ({report["checkpoint"]}), layer `{report["layer"]}`, up to '
             f'{report["max_queries"]} sampled queries per size.', ''] + md_table(
        ['input', 'tokens', 'kind', 'entropy / log N', 'max weight', 'effective keys',
         'effective / N'], rows, 'lrlrrrr')
    return '\n'.join(lines) + '\n'


def plot(report: Dict[str, Any], path: str) -> None:
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 4))
    kinds = list(dict.fromkeys(r['kind'] for r in report['results']))
    for ax, key, label in zip(axes, ('effective_keys', 'max_weight', 'normalized_entropy'),
                              ('effective keys exp(H)', 'max weight', 'entropy / log N')):
        for kind in kinds:
            rs = [r for r in report['results'] if r['kind'] == kind]
            ax.plot([r['tokens'] for r in rs], [r[key] for r in rs], '-o', markersize=3,
                    label=kind)
        ax.set_xscale('log')
        if key != 'normalized_entropy':
            ax.set_yscale('log')
        ax.set_xlabel('tokens N at the probed layer')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f'{report["model"]} ({report["checkpoint"]}), {report["layer"]}', fontsize=9)
    save_figure(fig, path)


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    write_outputs(args.out_dir, {'dispersion.json': report, 'dispersion.md': markdown(report)})
    if not args.no_plot:
        plot(report, osp.join(args.out_dir, 'dispersion.png'))
    print(f'wrote {args.out_dir}/dispersion.json, dispersion.md'
          + ('' if args.no_plot else ', dispersion.png'))
    return report


if __name__ == '__main__':
    main()
