#!/usr/bin/env python
"""Evaluate one checkpoint at several input sizes and write one JSON + Markdown table.

    python tools/analysis_tools/resolution_sweep.py CONFIG CKPT --sizes 224 448 672 1024 \
        [--work-dir DIR] [--out PREFIX] [--cfg-options k=v ...] [--dry-run]

Each size runs ``tools/test.py`` in a fresh process with ``--cfg-options`` that rescale the test
pipeline (no fine-tuning). With a ``CenterCrop`` (classifiers) the crop becomes ``S`` and the
resizes before it scale with it; without one, ``S`` is the short side of the first resize and
every resize scales by the same factor. mmseg's sliding-window ``crop_size`` is kept. Writes
``PREFIX.json`` (overrides and metrics per size) and ``PREFIX.md``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Sequence

from mmeffattn.analysis.report import md_table, write_outputs

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

RESIZES = ('Resize', 'ResizeEdge', 'RandomResize')
CROPS = ('CenterCrop', )
PIPELINE_KEY = 'test_dataloader.dataset.pipeline'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--sizes', type=int, nargs='+', required=True,
                        help='input sizes: the crop side (classifiers) or the short side')
    parser.add_argument('--work-dir', help='where the per-size runs go (default: '
                        'work_dirs/resolution_sweep/<config name>)')
    parser.add_argument('--out', help='output prefix of the .json and .md (default: '
                        'WORK_DIR/resolution_sweep)')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='passed to every test.py run (before the size overrides)')
    parser.add_argument('--timeout', type=float, default=None,
                        help='seconds allowed for each test.py run (default: none)')
    parser.add_argument('--dry-run', action='store_true',
                        help='print the test.py commands without running them')
    args = parser.parse_args(argv)
    bad = [s for s in args.sizes if s < 1]
    if bad:
        parser.error(f'--sizes must be positive integers, got {bad}')
    return args


def _type_name(t: dict) -> str:
    return str(t.get('type', '')).split('.')[-1]


def _scale_value(value, factor: float):
    """An int, or a pair of ints (mmcv's (w, h) or mmpretrain's), multiplied by ``factor``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(1, round(value * factor))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return [max(1, round(v * factor)) if v not in (None, -1) else v for v in value]
    raise ValueError(f'cannot rescale the size {value!r}: expected an int or a pair')


def _short_side(value) -> int:
    if isinstance(value, (int, float)):
        return int(value)
    return int(min(v for v in value if v not in (None, -1)))


def size_overrides(pipeline: Sequence[dict], size: int) -> Dict[str, object]:
    """``--cfg-options`` entries that set the test pipeline to input size ``size``.

    Args:
        pipeline: the config's ``test_dataloader.dataset.pipeline`` (a list of dicts).
        size: the crop side (with a ``CenterCrop``) or the short side.

    Returns:
        ``{'test_dataloader.dataset.pipeline.<i>.<field>': value}``.
    """
    if any(_type_name(t) == 'TestTimeAug' for t in pipeline):
        raise ValueError('the test pipeline uses TestTimeAug; sweep the sizes on the plain test '
                         'pipeline (drop --tta / use the config without TTA)')
    resizes = [(i, t) for i, t in enumerate(pipeline) if _type_name(t) in RESIZES
               and 'scale' in t]
    crops = [(i, t) for i, t in enumerate(pipeline) if _type_name(t) in CROPS]
    if not resizes and not crops:
        types = [_type_name(t) for t in pipeline]
        raise ValueError(f'the test pipeline {types} has no {RESIZES + CROPS} transform to '
                         f'rescale; add a Resize to the config\'s test pipeline')
    out: Dict[str, object] = {}
    if crops:
        i, crop = crops[0]
        old = _short_side(crop['crop_size'])
        factor = size / old
        for j, c in crops:
            out[f'{PIPELINE_KEY}.{j}.crop_size'] = size if isinstance(
                c['crop_size'], (int, float)) else [size, size]
    else:
        factor = size / _short_side(resizes[0][1]['scale'])
    for i, t in resizes:
        out[f'{PIPELINE_KEY}.{i}.scale'] = _scale_value(t['scale'], factor)
    return out


def _format_option(key: str, value) -> str:
    """``key=value`` as mmengine's DictAction parses it (a pair as ``(a,b)``)."""
    if isinstance(value, (list, tuple)):
        return f'{key}=({",".join(str(v) for v in value)})'
    return f'{key}={value}'


def markdown_table(rows: List[dict]) -> str:
    """``| size | metric ... |`` with one row per size; metrics missing in a run show ``-``."""
    keys = list(dict.fromkeys(k for r in rows for k in r['metrics']))
    cells = [[r['size']] + ['-' if v is None else f'{v:.2f}' if isinstance(v, float) else v
                            for v in (r['metrics'].get(k) for k in keys)] for r in rows]
    return '\n'.join(md_table(['size'] + keys, cells)) + '\n'


def run_size(args: argparse.Namespace, size: int, overrides: Dict[str, object],
             work_dir: str) -> dict:
    size_dir = osp.join(work_dir, f'size_{size}')
    out_json = osp.join(size_dir, 'test_metrics.json')
    options = list(args.cfg_options) + [_format_option(k, v) for k, v in overrides.items()]
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'test.py'), args.config, args.checkpoint,
           '--work-dir', size_dir, '--out-json', out_json, '--cfg-options', *options]
    if args.dry_run:
        print(' '.join(cmd))
        return dict(size=size, overrides=overrides, metrics={})
    print(f'[resolution_sweep] size {size}: {" ".join(options)}', flush=True)
    proc = subprocess.run(cmd, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f'tools/test.py failed at size {size} (exit {proc.returncode}); the '
                           f'command was:\n{" ".join(cmd)}')
    with open(out_json) as f:
        metrics = json.load(f)['metrics']
    return dict(size=size, overrides=overrides, metrics=metrics)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from mmeffattn.engine.runner_setup import load_config  # the same loading as test.py
    cfg = load_config(args.config)
    if args.cfg_options:
        from mmengine.config import DictAction
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--o', *args.cfg_options]).o)
    try:
        pipeline = cfg.test_dataloader.dataset.pipeline
    except AttributeError:
        raise ValueError(f'{args.config} has no test_dataloader.dataset.pipeline; the sweep '
                         f'rescales the test pipeline (wrapped datasets are not supported)')
    work_dir = args.work_dir or osp.join(
        'work_dirs', 'resolution_sweep', osp.splitext(osp.basename(args.config))[0])
    os.makedirs(work_dir, exist_ok=True)
    plan = [(s, size_overrides(pipeline, s)) for s in args.sizes]  # fail early on bad pipelines
    rows = [run_size(args, s, o, work_dir) for s, o in plan]
    record = dict(config=args.config, checkpoint=args.checkpoint, results=rows)
    if not args.dry_run:
        prefix = args.out or osp.join(work_dir, 'resolution_sweep')
        table = markdown_table(rows)
        name = osp.basename(prefix)
        write_outputs(osp.dirname(osp.abspath(prefix)), {
            name + '.json': record, name + '.md': f'Checkpoint `{args.checkpoint}`, config '
            f'`{args.config}`, test pipeline rescaled per size (no fine-tuning).\n\n' + table})
        print(table)
        print(f'[resolution_sweep] wrote {prefix}.json and {prefix}.md')
    return record


if __name__ == '__main__':
    main()
