#!/usr/bin/env python
"""Evaluate a checkpoint on a config's test set and write the metrics to a JSON file.

    python tools/test.py CONFIG CHECKPOINT_OR_URL [--work-dir DIR] [--out-json PATH]
                         [--out PREDICTIONS.pkl] [--show-dir DIR] [--tta]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [args]

CHECKPOINT is a path or URL: ours, mmengine's, or an official one (MLLA, WeightFormer),
converted with its head. It must fill the model exactly (a mismatch stops the run with one line
naming the keys); ``--cfg-options`` that set an ``init_cfg`` are refused, as nothing else loads
weights at test time. ``--tta`` evaluates with the config's ``tta_model`` and ``tta_pipeline``.
"""
import argparse
import json
import os
import os.path as osp
from typing import Optional

from mmengine.config import DictAction

import mmeffattn  # noqa: F401
from mmeffattn.engine import check_dataset_paths, open_checkpoint
from mmeffattn.engine.checkpoint_io import OFFICIAL_STAND_INS, CheckpointError
from mmeffattn.engine.runner_setup import (check_compile_option, load_config,
                                           load_whole_checkpoints, prepare_compile,
                                           prepare_runtime, run_cli, set_work_dir,
                                           setup_launcher)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file or URL (official layouts too)')
    parser.add_argument('--work-dir', help='where logs (and by default the metrics JSON) go')
    parser.add_argument('--out-json', help='metrics JSON file, or a folder for '
                        'test_metrics.json (default: WORK_DIR)')
    parser.add_argument('--out', help='dump the predictions to this .pkl file (mmengine '
                                      'DumpResults)')
    parser.add_argument('--show-dir', help='draw predictions on the test images into this folder')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation from the config's tta_model/tta_pipeline")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.backbone.window_size=8')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def enable_visualization(cfg, show_dir: str) -> None:
    """Turn on the downstream library's visualization hook for every test image."""
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise RuntimeError('--show-dir needs a "visualization" entry in default_hooks')
    kind = hook['type'].split('.')[-1]
    if kind == 'DetVisualizationHook':  # mmdet
        hook.update(draw=True, test_out_dir=osp.abspath(show_dir))
    elif kind == 'SegVisualizationHook':  # mmseg writes through the visualizer's save_dir
        hook.update(draw=True, interval=1)
        cfg.visualizer['save_dir'] = osp.abspath(show_dir)
    elif kind == 'VisualizationHook':  # mmpretrain: draws one sample in `interval` (5000)
        hook.update(enable=True, interval=1, out_dir=osp.abspath(show_dir))
    else:
        raise RuntimeError(f'--show-dir does not know the visualization hook {hook["type"]!r}')


# What to add to a config without test-time augmentation (no silent flip-only default)
TTA_HINTS = {
    'mmseg': "tta_model = dict(type='SegTTAModel') (mmseg::_base_/default_runtime.py) and a "
             "tta_pipeline like the one in mmseg::_base_/datasets/ade20k.py (Resize with "
             "scale_factor in img_ratios x RandomFlip prob 0/1, then LoadAnnotations, "
             "PackSegInputs, inside a TestTimeAug)",
    'mmdet': "both at once with _base_ = [<your base>, 'mmdet::retinanet/retinanet_tta.py'] "
             "(tta_model = dict(type='DetTTAModel', tta_cfg=dict(nms=..., max_per_img=100)) and "
             "a TestTimeAug tta_pipeline of scales x RandomFlip prob 1/0)",
    'mmpretrain': "tta_model = dict(type='mmpretrain.AverageClsScoreTTA') and a tta_pipeline "
                  "that ends in dict(type='TestTimeAug', transforms=[[RandomFlip prob 1., "
                  "RandomFlip prob 0.], [PackInputs]])",
}


def _innermost_dataset(dataset_cfg):
    """The dataset under any wrappers (``dataset=dict(type='RepeatDataset', dataset=...)``)."""
    while 'dataset' in dataset_cfg:
        dataset_cfg = dataset_cfg['dataset']
    return dataset_cfg


def _has_mask_head(model_cfg) -> bool:
    roi_head = model_cfg.get('roi_head') or {}
    return bool(roi_head.get('mask_head')) or bool(model_cfg.get('mask_head'))


def apply_tta(cfg, config_path: Optional[str] = None) -> None:
    """Wrap ``cfg.model`` in ``tta_model`` and put ``tta_pipeline`` in the test dataset, in
    place; a ``ValueError`` names what to add, or that mmdet cannot merge masks."""
    where = f'the config {config_path!r}' if config_path else 'the config'
    scope = cfg.get('default_scope') or 'mmengine'
    tta_type = str((cfg.get('tta_model') or {}).get('type', '')).split('.')[-1]
    if scope == 'mmdet' and _has_mask_head(cfg.model) and tta_type in ('', 'DetTTAModel'):
        raise ValueError(
            f'--tta: {where} is an instance-segmentation model (it has a mask head), and mmdet\'s '
            f'DetTTAModel merges boxes only (it refuses predictions with masks). Use --tta with a '
            f'box detector (e.g. configs/*/retinanet_*.py), or test without --tta')
    missing = [key for key in ('tta_model', 'tta_pipeline') if not cfg.get(key)]
    if missing:
        hint = TTA_HINTS.get(scope, 'tta_model (a BaseTTAModel subclass) and tta_pipeline (the '
                                    'test pipeline with a TestTimeAug step)')
        raise ValueError(f'--tta needs {" and ".join(missing)} in {where}, which has no '
                         f'{" or ".join(missing)} (default_scope {scope!r}). Add {hint}')
    from mmengine.config import ConfigDict
    if cfg.get('test_dataloader') is None:
        raise ValueError(f'--tta: {where} has no test_dataloader whose pipeline to replace')
    _innermost_dataset(cfg.test_dataloader.dataset).pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def metrics_path(out_json: Optional[str], work_dir: str) -> str:
    """The metrics file for ``--out-json``: ``test_metrics.json`` in the work dir or in a
    folder given (decided before the evaluation, so no metrics are lost)."""
    if not out_json:
        return osp.join(work_dir, 'test_metrics.json')
    if osp.isdir(out_json) or out_json.endswith(('/', os.sep)):
        return osp.join(out_json, 'test_metrics.json')
    return out_json


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
    """``compile=True`` compiles the model's ``test_step`` (mmengine's ``test()`` ignores the
    option); inductor freezes the weights as constants, as the loop runs without gradients."""
    option = cfg.get('compile')
    if not option:
        return
    prepare_compile(runner)
    runner._maybe_compile('test_step')
    if not isinstance(option, dict) or option.get('backend', 'inductor') == 'inductor':
        import torch
        compiled = runner.model.test_step

        def test_step(*args, **kwargs):
            with torch._inductor.config.patch(freezing=True):  # read when a graph compiles
                return compiled(*args, **kwargs)

        runner.model.test_step = test_step


def check_no_init_cfg(cfg_options: Optional[dict]) -> None:
    """Refuse ``--cfg-options`` that set an ``init_cfg`` or ``pretrained``: CHECKPOINT alone
    is loaded."""
    keys = [k for k in cfg_options or {} if 'init_cfg' in k or k.split('.')[-1] == 'pretrained']
    if keys:
        raise CheckpointError(
            f'--cfg-options {", ".join(keys)}: tools/test.py evaluates the weights of its '
            f'CHECKPOINT argument alone (the Runner does not initialise weights at test time): '
            f'pass that file or URL as CHECKPOINT (official layouts are converted)')


def main(argv=None) -> dict:
    args = parse_args(argv)
    check_no_init_cfg(args.cfg_options)
    prepare_runtime()  # the scoped safe loader and mmeffattn:: configs (opt-in)
    cfg = load_config(args.config, args.cfg_options)
    check_compile_option(cfg)
    set_work_dir(cfg, args.config, args.work_dir)
    out = metrics_path(args.out_json, cfg.work_dir)
    if args.tta:  # before anything is loaded, so that a config without TTA fails at once
        apply_tta(cfg, args.config)
    # a bad file or a failed download ends here with one line, before anything is built
    loaded = open_checkpoint(args.checkpoint, extra_safe_globals=OFFICIAL_STAND_INS)
    cfg.load_from = args.checkpoint
    if args.out:
        dump = dict(type='DumpResults', out_file_path=args.out)
        evaluator = cfg.test_evaluator
        cfg.test_evaluator = [*evaluator, dump] if isinstance(evaluator, (list, tuple)) else \
            [evaluator, dump]
    if args.show_dir:
        enable_visualization(cfg, args.show_dir)
    check_dataset_paths(cfg, ['test'])
    # no training loop: a hook reading runner.iter would build it and the training set with it
    for key in ('train_dataloader', 'train_cfg', 'optim_wrapper', 'param_scheduler'):
        cfg[key] = None
    setup_launcher(cfg, args.launcher)

    from mmengine.config import Config
    from mmengine.dist import is_main_process
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    # without a file name the Runner dumps WORK_DIR/<timestamp>.py, not over the training
    # run's WORK_DIR/<config name>; it is moved into this run's log folder
    cfg = Config(cfg.to_dict(), filename=None)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    keep_test_config_dump(runner, args.config)
    load_whole_checkpoints(runner, loaded)  # strict, official layouts converted
    maybe_compile_test(runner, cfg)
    metrics = runner.test()
    if not metrics:
        runner.logger.warning('the evaluator returned no metrics (for detection: no prediction '
                              'passed the score threshold); the JSON records an empty dict')

    if is_main_process():
        os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
        record = dict(config=args.config, checkpoint=args.checkpoint, tta=args.tta,
                      metrics={k: to_jsonable(v) for k, v in metrics.items()})
        with open(out, 'w') as f:
            json.dump(record, f, indent=2)
        runner.logger.info(f'metrics written to {out}')
    return metrics


if __name__ == '__main__':
    run_cli(main)
