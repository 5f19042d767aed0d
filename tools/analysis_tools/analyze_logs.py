#!/usr/bin/env python
"""Curves, training time and a summary from the logs of tools/train.py.

    python tools/analysis_tools/analyze_logs.py plot_curve work_dirs/demo --keys loss loss_mask
    python tools/analysis_tools/analyze_logs.py plot_curve work_dirs/a work_dirs/b \\
        --keys coco/bbox_mAP --legend a b --out bbox.png
    python tools/analysis_tools/analyze_logs.py cal_train_time work_dirs/demo
    python tools/analysis_tools/analyze_logs.py summary work_dirs/demo

Each path is a work dir (its training runs read as one history across resumes,
:mod:`mmeffattn.analysis.logs`) or one ``<timestamp>/vis_data/scalars.json``.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional, Sequence

from mmeffattn.analysis.logs import TrainLog, load_log, train_time
from mmeffattn.analysis.report import pyplot, save_figure


def plot_curve(logs: List[TrainLog], keys: Sequence[str], legend: Sequence[str], out: str,
               title: Optional[str] = None) -> str:
    """One figure: each key of each log as a line (one axes per x unit). Returns ``out``."""
    curves = {}  # x label -> [(x, y, label)]
    for log, name in zip(logs, legend):
        for key in keys:
            x, y, x_label = log.series(key)  # KeyError naming the available keys
            label = key if len(logs) == 1 else (name if len(keys) == 1 else f'{name}: {key}')
            curves.setdefault(x_label, []).append((x, y, label))
    fig, axes = pyplot().subplots(1, len(curves), figsize=(6.4 * len(curves), 4.4), squeeze=False)
    for ax, (x_label, lines) in zip(axes[0], curves.items()):
        for x, y, label in lines:
            ax.plot(x, y, marker='o' if len(x) < 30 else None, markersize=3, label=label)
        ax.set_xlabel(x_label)
        ax.grid(alpha=.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    if osp.dirname(out):
        os.makedirs(osp.dirname(out), exist_ok=True)
    return save_figure(fig, out)


def print_train_time(log: TrainLog, name: str) -> dict:
    t = train_time(log)
    unit = 'epoch' if t['by_epoch'] else 'run'
    print(f'{name}: {t["mean"]:.4f} s/iter on average over {len(t["per_epoch"])} '
          f'{unit}{"s" if len(t["per_epoch"]) > 1 else ""}')
    if t['by_epoch'] and len(t['per_epoch']) > 1:
        print(f'  slowest epoch {t["slowest"][0]} ({t["slowest"][1]:.4f} s/iter), fastest epoch '
              f'{t["fastest"][0]} ({t["fastest"][1]:.4f} s/iter), std over epochs '
              f'{t["std"]:.4f}')
    return t


def summary(log: TrainLog, name: str) -> dict:
    """The last training line's losses and, per validation metric, its last and best value."""
    last = log.train[-1]
    where = f'epoch {last["epoch"]}, ' if 'epoch' in last else ''
    # mmseg logs each head's losses under its prefix (decode.loss_ce, aux.loss_ce)
    losses = {k: v for k, v in last.items() if k.split('.')[-1].startswith('loss')}
    print(f'{name}: {len(log.sources)} training run(s), last logged at {where}iteration '
          f'{last["step"]}')
    if losses:
        print('  ' + ', '.join(f'{k} {v:.4f}' for k, v in losses.items()))
    metrics = {}
    for key in log.keys()['val']:
        if key in ('time', 'data_time'):  # the validation loop's speed, not a metric
            continue
        x, y, unit = log.series(key, kind='val')
        # OpenMMLab's metrics (mAP, mIoU, accuracy) are better when higher
        best = max(range(len(y)), key=y.__getitem__)
        metrics[key] = dict(last=y[-1], best=y[best], best_at=x[best])
        print(f'  {key}: last {y[-1]:.4f}, highest {y[best]:.4f} at {unit} {x[best]}')
    if not log.val:
        print('  no validation logged')
    for file, why in log.skipped:
        print(f'  (left out {file}: {why})')
    return dict(losses=losses, metrics=metrics)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='task', required=True)
    curve = sub.add_parser('plot_curve', help='plot logged quantities against the iteration '
                           'or epoch')
    curve.add_argument('logs', nargs='+', help='work dirs or scalars.json files')
    curve.add_argument('--keys', nargs='+', default=['loss'],
                       help='quantities to plot (e.g. loss lr coco/bbox_mAP mIoU)')
    curve.add_argument('--legend', nargs='+', help='one name per log (default: the paths)')
    curve.add_argument('--title')
    curve.add_argument('--out', default='curves.png', help='image file (.png, .pdf, .svg)')
    for name, text in (('cal_train_time', 'seconds per iteration, per epoch'),
                       ('summary', 'last losses, last and best validation metrics')):
        s = sub.add_parser(name, help=text)
        s.add_argument('logs', nargs='+', help='work dirs or scalars.json files')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logs = [load_log(path) for path in args.logs]
    if args.task == 'plot_curve':
        legend = args.legend or args.logs
        if len(legend) != len(logs):
            raise SystemExit(f'--legend has {len(legend)} names for {len(logs)} logs')
        out = plot_curve(logs, args.keys, legend, args.out, args.title)
        print(f'wrote {out}')
        return out
    fn = print_train_time if args.task == 'cal_train_time' else summary
    return [fn(log, path) for log, path in zip(logs, args.logs)]


if __name__ == '__main__':
    try:
        main()
    except (FileNotFoundError, KeyError, ValueError) as e:
        sys.exit(f'error: {e.args[0] if e.args else e}')
