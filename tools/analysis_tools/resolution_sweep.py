#!/usr/bin/env python
"""Evaluate one checkpoint at several input sizes and write one JSON + Markdown table.

    python tools/analysis_tools/resolution_sweep.py CONFIG CKPT --sizes 224 448 672 1024 \
        [--work-dir DIR] [--out PREFIX] [--cfg-options k=v ...] [--dry-run]

For every size the tool runs ``tools/test.py`` (a fresh process each time, as a user would) with
``--cfg-options`` that rescale the *test* pipeline, and collects the metrics JSON it writes. No
fine-tuning: the weights are the checkpoint's (SEMA's 224 -> 448/672/1024 experiment, VECA's
"256 to 1024 px" claim).

How a size ``S`` is applied, by transform type in ``test_dataloader.dataset.pipeline`` (mmpretrain,
mmseg and mmdet test pipelines):

- with a ``CenterCrop`` (classifiers): the crop becomes ``S`` and every resize before it is scaled
  by ``S / old_crop``, so the config's resize/crop ratio (256/224 for most) is kept;
- without a crop (detection, segmentation): every resize is scaled by ``S / short side`` of the
  first resize, so ``S`` is the short side (mmdet's 1333x800 at S=800 stays itself; mmseg's
  2048x512 becomes 4S x S).

Scaled fields: ``Resize.scale`` (int or pair), ``ResizeEdge.scale``, ``RandomResize.scale``
and ``CenterCrop.crop_size``. A test pipeline wrapped in ``TestTimeAug`` or without any of these
transforms is rejected with an error naming the problem. mmseg's sliding-window inference keeps its
``crop_size``; that is part of the method, not of the input size.

Outputs: ``PREFIX.json`` (config, checkpoint, and for each size the overrides used and the
metrics) and ``PREFIX.md`` (one row per size, one column per metric). PREFIX defaults to
``WORK_DIR/resolution_sweep``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Sequence

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
    keys: List[str] = []
    for r in rows:
        for k in r['metrics']:
            if k not in keys:
                keys.append(k)
    lines = ['| size | ' + ' | '.join(keys) + ' |', '|---' * (len(keys) + 1) + '|']
    for r in rows:
        cells = []
        for k in keys:
            v = r['metrics'].get(k)
            cells.append('-' if v is None else (f'{v:.2f}' if isinstance(v, float) else str(v)))
        lines.append(f'| {r["size"]} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


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
        os.makedirs(osp.dirname(osp.abspath(prefix)), exist_ok=True)
        with open(prefix + '.json', 'w') as f:
            json.dump(record, f, indent=2)
        table = markdown_table(rows)
        with open(prefix + '.md', 'w') as f:
            f.write(f'Checkpoint `{args.checkpoint}`, config `{args.config}`, test pipeline '
                    f'rescaled per size (no fine-tuning).\n\n' + table)
        print(table)
        print(f'[resolution_sweep] wrote {prefix}.json and {prefix}.md')
    return record


if __name__ == '__main__':
    main()
