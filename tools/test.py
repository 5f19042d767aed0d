#!/usr/bin/env python
"""Evaluate a checkpoint on a config's test set and write the metrics to a JSON file.

    python tools/test.py CONFIG CHECKPOINT_OR_URL [--work-dir DIR] [--out-json PATH]
                         [--out PREDICTIONS.pkl] [--show-dir DIR] [--tta]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [args]

CHECKPOINT is what an ``init_cfg`` takes: a path or URL (downloaded once, cached), a checkpoint
of ours or mmengine's, or the authors' published checkpoint (official MLLA, WeightFormer
``.pth``/``.safetensors``), converted with its classification head into the config's model. It
must fill the model exactly: a missing, unexpected or mis-shaped key stops the run with one line
naming the keys, so no part of the model is ever evaluated at its random init. The config's own
``init_cfg`` entries do not apply at test time (the Runner does not initialise weights), so
``--cfg-options`` that set one are refused.

``--tta`` evaluates with the config's own test-time augmentation, as the downstream tools do:
the model is wrapped in ``tta_model`` and ``tta_pipeline`` replaces the test pipeline. The ADE20K
UperNet configs inherit mmseg's (image ratios 0.5-1.75 x horizontal flip, the multi-scale mIoU);
the RetinaNet configs inherit mmdet's ``retinanet/retinanet_tta.py`` (3 scales x flip, NMS).
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
    parser.add_argument('--out-json',
                        help='metrics JSON path (default: WORK_DIR/test_metrics.json); an '
                             'existing folder, or a path ending in /, gets test_metrics.json '
                             'inside it')
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
    """Turn on the downstream library's visualization hook, whichever it is, for every test
    image."""
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


# What to add when a config has no test-time augmentation, per downstream library (default_scope).
# mmdet's and mmpretrain's test.py would fall back to a flip-only default here; this tool does not,
# so that "--tta" never reports a number from an augmentation nobody chose.
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
    """Turn ``cfg`` into its test-time-augmented form, in place.

    ``cfg.model`` becomes ``tta_model`` with the original model as its ``module``, and the test
    dataset's pipeline becomes ``tta_pipeline`` (the data root, annotations and evaluator are
    untouched). Raises ``ValueError`` naming what to add when the config has no
    ``tta_model``/``tta_pipeline``, and for Mask R-CNN-style models, whose masks mmdet's
    ``DetTTAModel`` cannot merge.
    """
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
    """The metrics JSON file for ``--out-json`` (``None``: ``WORK_DIR/test_metrics.json``).

    A folder (one that exists, or a path ending in a separator) gets ``test_metrics.json`` inside
    it. Decided before the evaluation: opening a folder as the file failed only after it, with
    ``IsADirectoryError``, and the metrics were lost.
    """
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
    """``compile=True`` (or a dict of ``torch.compile`` options, ``--cfg-options compile=True``)
    compiles the model's ``test_step``, as mmengine's Runner compiles ``train_step`` for
    training (its ``test()`` ignores the option); the data preprocessor stays eager
    (:func:`~mmeffattn.engine.runner_setup.prepare_compile`). Inductor's graphs are frozen
    (``freezing``): the test loop runs without gradients, so the weights become constants that
    inductor folds (a convolution's BatchNorm) and pre-packs for the CPU's kernels."""
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
    """Refuse ``--cfg-options`` that set weights through an ``init_cfg`` or ``pretrained``: at
    test time nothing initialises weights, CHECKPOINT alone is loaded."""
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
    # A missing, truncated or refused file (or a failed download) ends here with one line,
    # before anything is built.
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
    # A test run trains nothing. With a training loop configured, a hook that reads runner.iter
    # (mmseg's visualization hook) builds it, and with it the training set, which the machine
    # that tests may not have.
    for key in ('train_dataloader', 'train_cfg', 'optim_wrapper', 'param_scheduler'):
        cfg[key] = None
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
