#!/usr/bin/env python
"""Train a detector, segmentor or classifier from an mmdet / mmseg / mmpretrain config.

    python tools/train.py configs/mask_rcnn_sema_t_3x.py [--work-dir DIR] [--amp] [--resume]
    bash tools/dist_train.sh CONFIG NUM_PROCS [args]   # distributed (GPU: nccl, CPU: gloo)

``load_from`` takes what tools/test.py's CHECKPOINT takes (a path or URL, official layouts
converted with their head) and loads it strictly.
"""
import argparse
import os

from mmengine.config import DictAction

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.engine import check_dataset_paths
from mmeffattn.engine.runner_setup import (add_exact_resume_hook, check_compile_option,
                                           configure_resume, enable_amp, load_config,
                                           load_whole_checkpoints, prepare_compile,
                                           prepare_runtime, run_cli, set_work_dir,
                                           setup_launcher)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='where logs and checkpoints go')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 on a GPU, bf16 autocast on the CPU')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the actual total batch size')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from this checkpoint, or (no value) from the latest one in the work dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_epochs=1')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_cfg(args: argparse.Namespace):
    cfg = load_config(args.config, args.cfg_options)
    check_compile_option(cfg)
    set_work_dir(cfg, args.config, args.work_dir)
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        if cfg.get('auto_scale_lr') and 'base_batch_size' in cfg.auto_scale_lr:
            cfg.auto_scale_lr.enable = True
        else:
            raise RuntimeError(
                '--auto-scale-lr needs "auto_scale_lr.base_batch_size" in the config')
    # Checkpoints carry the random streams and the data position, so a resume is exact.
    add_exact_resume_hook(cfg)
    configure_resume(cfg, args.resume)
    return cfg


def main(argv=None) -> None:
    args = parse_args(argv)
    prepare_runtime()  # atomic saves, the scoped safe loader, mmeffattn:: configs (opt-in)
    cfg = build_cfg(args)
    # Fail on a missing dataset now, not after the model is built.
    check_dataset_paths(cfg, ['train'])
    setup_launcher(cfg, args.launcher)

    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    if cfg.get('load_from') and not cfg.get('resume'):
        load_whole_checkpoints(runner)  # strict, a URL or an official layout as test.py's
    prepare_compile(runner)  # compile=True: what mmengine compiles, and what stays eager
    runner.train()


if __name__ == '__main__':
    run_cli(main)
