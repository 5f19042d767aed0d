#!/usr/bin/env python
"""Evaluate a checkpoint on a config's test set and write the metrics to a JSON file.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out-json PATH] [--show-dir DIR]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [args]
"""
import argparse
import json
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmeffattn  # noqa: E402,F401
from mmeffattn.engine import check_dataset_paths  # noqa: E402
from mmeffattn.engine import load_checkpoint_file  # noqa: E402
from mmeffattn.engine.runner_setup import (DictAction, load_config, prepare_runtime,  # noqa: E402
                                           run_cli, set_work_dir, setup_launcher)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where logs (and by default the metrics JSON) go')
    parser.add_argument('--out-json',
                        help='metrics JSON path (default: WORK_DIR/test_metrics.json)')
    parser.add_argument('--show-dir', help='draw predictions on the test images into this folder')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.backbone.window_size=8')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def enable_visualization(cfg, show_dir: str) -> None:
    """Turn on the downstream library's visualization hook, whichever it is."""
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise RuntimeError('--show-dir needs a "visualization" entry in default_hooks')
    kind = hook['type'].split('.')[-1]
    if kind == 'DetVisualizationHook':  # mmdet
        hook.update(draw=True, test_out_dir=osp.abspath(show_dir))
    elif kind == 'SegVisualizationHook':  # mmseg writes through the visualizer's save_dir
        hook.update(draw=True, interval=1)
        cfg.visualizer['save_dir'] = osp.abspath(show_dir)
    elif kind == 'VisualizationHook':  # mmpretrain
        hook.update(enable=True, out_dir=osp.abspath(show_dir))
    else:
        raise RuntimeError(f'--show-dir does not know the visualization hook {hook["type"]!r}')


def to_jsonable(value):
    try:
        return float(value) if not isinstance(value, (int, str, bool)) else value
    except (TypeError, ValueError):
        return str(value)


def keep_test_config_dump(runner, config_path: str) -> None:
    """Move the Runner's ``WORK_DIR/<timestamp>.py`` to ``WORK_DIR/<timestamp>/test_<name>``."""
    from mmengine.dist import is_main_process
    dumped = osp.join(runner.work_dir, f'{runner.timestamp}.py')
    if is_main_process() and osp.isfile(dumped):
        os.makedirs(runner.log_dir, exist_ok=True)
        os.replace(dumped, osp.join(runner.log_dir, 'test_' + osp.basename(config_path)))


def maybe_compile_test(runner, cfg) -> None:
    """``compile=True`` (or a dict of ``torch.compile`` options, ``--cfg-options compile=True``)
    compiles the model's ``test_step``, as mmengine's Runner compiles ``train_step`` for
    training (its ``test()`` ignores the option)."""
    if cfg.get('compile'):
        runner._maybe_compile('test_step')


def main(argv=None) -> dict:
    args = parse_args(argv)
    prepare_runtime()
    cfg = load_config(args.config, args.cfg_options)
    set_work_dir(cfg, args.config, args.work_dir)
    # A missing, truncated or refused file ends here with one line, before anything is built.
    load_checkpoint_file(args.checkpoint, mmap=True)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        enable_visualization(cfg, args.show_dir)
    check_dataset_paths(cfg, ['test'])
    setup_launcher(cfg, args.launcher)

    from mmengine.config import Config
    from mmengine.dist import is_main_process
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    # The Runner dumps its config as WORK_DIR/<config name>, which is the training run's dump when
    # the work dirs match; without a file name it writes WORK_DIR/<timestamp>.py instead, which
    # is then moved into this run's own log folder (WORK_DIR/<timestamp>/).
    cfg = Config(cfg.to_dict(), filename=None)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    keep_test_config_dump(runner, args.config)
    maybe_compile_test(runner, cfg)
    metrics = runner.test()
    if not metrics:
        runner.logger.warning('the evaluator returned no metrics (for detection: no prediction '
                              'passed the score threshold); the JSON records an empty dict')

    if is_main_process():
        out = args.out_json or osp.join(cfg.work_dir, 'test_metrics.json')
        os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
        record = dict(config=args.config, checkpoint=args.checkpoint,
                      metrics={k: to_jsonable(v) for k, v in metrics.items()})
        with open(out, 'w') as f:
            json.dump(record, f, indent=2)
        runner.logger.info(f'metrics written to {out}')
    return metrics


if __name__ == '__main__':
    run_cli(main)
