#!/usr/bin/env python
"""The demo: train Mask R-CNN + SEMA-T on generated shapes, evaluate it, draw predictions.

Runs tools/train.py and tools/test.py on a generated COCO-format dataset (no download):

    python tools/demo.py                        # about 20 minutes on 2 CPU cores
    python tools/demo.py --epochs 1 --num-train 16 --num-val 8 --work-dir work_dirs/demo_smoke
                                                # a quick smoke run, kept apart from the demo

Re-running the same command resumes it; a work dir holding a run of other settings (recorded
in WORK_DIR/demo_run.json) is renamed to WORK_DIR.old-<time>, never deleted.
"""
import argparse
import glob
import hashlib
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, Optional, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = osp.join(ROOT, 'configs', 'demo', 'mask-rcnn_sema-t_fpn_shapes.py')
#: In the work dir: the settings its run was started with, compared by the next run.
MANIFEST = 'demo_run.json'


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'),
                   help='checkpoints, logs, metrics and pictures go here; a run of the same '
                        'settings there is resumed, one of other settings is moved aside')
    p.add_argument('--data-root', default=osp.join(ROOT, 'data', 'shapes'),
                   help='where the synthetic dataset is generated (reused if already there)')
    p.add_argument('--config', default=DEMO_CONFIG, help='the demo config')
    p.add_argument('--epochs', type=int, default=None, help='override the number of epochs')
    p.add_argument('--num-train', type=int, default=200, help='generated training images')
    p.add_argument('--num-val', type=int, default=50, help='generated validation images')
    p.add_argument('--num-draw', type=int, default=6, help='validation images to draw')
    p.add_argument('--seed', type=int, default=0, help='dataset and training seed')
    return p.parse_args(argv)


def run(cmd, what: str) -> None:
    print(f'\n=== {what}\n$ {" ".join(cmd)}', flush=True)
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f'=== {what}: done in {time.time() - start:.0f} s', flush=True)


def _sha256(*paths: str) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, 'rb') as f:
            h.update(f.read())
    return h.hexdigest()


def run_settings(config: str, data_root: str, seed: int, epochs: Optional[int]) -> dict:
    """What decides a run's training (dataset, config, schedule, seed): runs with equal settings
    train the same model, so one may resume the other."""
    from mmengine.config import Config

    from mmeffattn.datasets import load_shapes_meta
    # the config with its _base_ chain (the demo's overrides are recorded as values below)
    cfg = Config.fromfile(config, import_custom_modules=False)
    cfg_text = json.dumps(cfg.to_dict(), sort_keys=True, default=repr)
    meta = load_shapes_meta(data_root) or {}
    ann = osp.join(data_root, 'annotations')
    return dict(
        data_root=data_root,
        # the generator's parameters, and a hash that catches a dataset they do not describe
        dataset=meta.get('params'),
        dataset_sha256=_sha256(osp.join(ann, 'instances_train2017.json'),
                               osp.join(ann, 'instances_val2017.json')),
        config=osp.abspath(config),
        config_sha256=hashlib.sha256(cfg_text.encode()).hexdigest(),
        epochs=int(epochs if epochs is not None else cfg.train_cfg.max_epochs),
        seed=seed)


def _flat(d: dict, prefix: str = '') -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f'{prefix}{k}.'))
        else:
            out[f'{prefix}{k}'] = v
    return out


def settings_differences(old: dict, new: dict) -> List[str]:
    """``['dataset.num_train 8 -> 12', 'epochs 1 -> 2', 'config_sha256 differs', ...]``."""
    old, new = _flat(old), _flat(new)
    keys = [k for k in list(new) + [k for k in old if k not in new] if old.get(k) != new.get(k)]
    if any(k.startswith('dataset.') for k in keys):  # then the hash only repeats it
        keys = [k for k in keys if k != 'dataset_sha256']
    return [f'{k} differs' if k.endswith('sha256') else f'{k} {old.get(k)!r} -> {new.get(k)!r}'
            for k in keys]


def _has_checkpoints(work_dir: str) -> bool:
    return (osp.isfile(osp.join(work_dir, 'last_checkpoint'))
            or bool(glob.glob(osp.join(work_dir, '*.pth'))))


def read_manifest(work_dir: str) -> Optional[dict]:
    """The work dir's record of what its run was started with, or None (none, or unreadable)."""
    try:
        with open(osp.join(work_dir, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and 'settings' in manifest else None


def plan_work_dir(work_dir: str, settings: dict) -> Tuple[str, str]:
    """What this run does with ``work_dir``: ``('resume' | 'fresh' | 'move', why)``; only a run
    of the same settings is resumed (--resume would take any checkpoint)."""
    if not _has_checkpoints(work_dir):
        return 'fresh', 'no checkpoint in it'
    manifest = read_manifest(work_dir)
    if manifest is None:
        return 'move', (f'its checkpoints have no record of their settings ({MANIFEST}): they '
                        f'predate it or were not trained by tools/demo.py')
    diffs = settings_differences(manifest['settings'], settings)
    if diffs:
        return 'move', 'it holds a run of other settings: ' + ', '.join(diffs)
    return 'resume', f'it holds a run of these settings, started {manifest.get("started", "?")}'


def _move_aside(work_dir: str) -> str:
    stamp = time.strftime('%Y%m%d_%H%M%S')
    target, n = f'{work_dir}.old-{stamp}', 1
    while osp.exists(target):
        target, n = f'{work_dir}.old-{stamp}-{n}', n + 1
    try:
        os.rename(work_dir, target)
    except OSError as e:
        raise SystemExit(f'tools/demo.py: cannot move {work_dir} aside to {target} ({e}); pass '
                         f'--work-dir with a new folder for this run, or move it yourself')
    # mmengine records the latest checkpoint by its absolute path: point it into the moved folder
    record = osp.join(target, 'last_checkpoint')
    if osp.isfile(record):
        with open(record) as f:
            named = f.read().strip()
        if osp.normpath(osp.dirname(named)) == osp.normpath(work_dir):
            with open(record, 'w') as f:
                f.write(osp.join(target, osp.basename(named)))
    return target


def prepare_work_dir(work_dir: str, settings: dict) -> str:
    """Resume, start fresh or move the old run aside (:func:`plan_work_dir`), record a new run's
    ``settings``; returns the line to print."""
    action, why = plan_work_dir(work_dir, settings)
    if action == 'move':
        target = _move_aside(work_dir)
        line = (f'work dir: {work_dir}: {why}; moved it to {target} (nothing deleted) and '
                f'starting fresh. To go on with that run instead, rerun its command with '
                f'--work-dir {target}; give each set of settings its own --work-dir to keep '
                f'runs apart')
    elif action == 'resume':  # its record stands, start time included
        return f'work dir: {work_dir}: {why}: resuming it from its last checkpoint'
    else:
        line = f'work dir: {work_dir}: a new run ({why})'
    os.makedirs(work_dir, exist_ok=True)
    manifest = dict(tool='tools/demo.py', settings=settings,
                    started=time.strftime('%Y-%m-%d %H:%M:%S'))
    path = osp.join(work_dir, MANIFEST)
    from mmeffattn.engine import atomic_write  # a kill leaves the old record or the new one
    atomic_write(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    return line


def draw_predictions(config: str, checkpoint: str, data_root: str, out_dir: str,
                     num: int, cfg_options: dict) -> list:
    """Draw the model's predictions (score >= 0.5) on the first ``num`` val images."""
    import mmcv
    from mmdet.apis import inference_detector, init_detector
    from mmdet.registry import VISUALIZERS
    from mmengine.config import Config

    import mmeffattn  # noqa: F401
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    model = init_detector(cfg, checkpoint, device='cpu')
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    img_dir = osp.join(data_root, 'val2017')
    names = sorted(os.listdir(img_dir))[:num]
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name in names:
        img = mmcv.imread(osp.join(img_dir, name), channel_order='rgb')
        result = inference_detector(model, img)
        out = osp.join(out_dir, osp.splitext(name)[0] + '.png')
        visualizer.add_datasample(name, img, data_sample=result, draw_gt=False, show=False,
                                  pred_score_thr=0.5, out_file=out)
        written.append(out)
    return written


def main(argv=None) -> dict:
    args = parse_args(argv)
    t0 = time.time()
    work_dir = osp.abspath(args.work_dir)
    data_root = osp.abspath(args.data_root)
    py = sys.executable

    # 1. data: deterministic, generated once and reused
    from mmeffattn.datasets import generate_shapes_coco
    info = generate_shapes_coco(data_root, num_train=args.num_train, num_val=args.num_val,
                                seed=args.seed)
    print(f'dataset: {data_root} ({info["train"]["num_images"]} train / '
          f'{info["val"]["num_images"]} val images'
          f'{", reused" if not info["regenerated"] else ""})', flush=True)

    root = data_root.rstrip('/') + '/'
    options = {f'{split}_dataloader.dataset.data_root': root for split in ('train', 'val', 'test')}
    options.update({f'{split}_evaluator.ann_file': root + 'annotations/instances_val2017.json'
                    for split in ('val', 'test')}, **{'randomness.seed': args.seed})
    if args.epochs is not None:
        options.update({'train_cfg.max_epochs': args.epochs, 'train_cfg.val_interval': args.epochs})
    cfg_opts = [f'{k}={v}' for k, v in options.items()]

    def log_dirs() -> set:
        if not osp.isdir(work_dir):
            return set()
        return {d for d in os.listdir(work_dir) if d[:8].isdigit()}

    # 2. train: resumes from the last checkpoint if a run of the same settings was interrupted
    settings = run_settings(args.config, data_root, args.seed, args.epochs)
    print(prepare_work_dir(work_dir, settings), flush=True)
    before = log_dirs()
    run([py, 'tools/train.py', args.config, '--work-dir', work_dir, '--resume',
         '--cfg-options', *cfg_opts], 'training Mask R-CNN + SEMA-T')
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    train_logs = sorted(log_dirs() - before)
    log_file = (osp.join(work_dir, train_logs[-1], train_logs[-1] + '.log') if train_logs
                else '(none)')

    # 3. evaluate: COCO bbox / segm AP to JSON
    metrics_file = osp.join(work_dir, 'metrics.json')
    run([py, 'tools/test.py', args.config, checkpoint, '--work-dir', work_dir,
         '--out-json', metrics_file, '--cfg-options', *cfg_opts], 'evaluating on the val split')
    with open(metrics_file) as f:
        metrics = json.load(f)['metrics']

    # 4. pictures
    pictures = draw_predictions(args.config, checkpoint, data_root,
                                osp.join(work_dir, 'predictions'), args.num_draw, options)

    print('\n' + '=' * 72)
    print(f'Demo finished in {(time.time() - t0) / 60:.1f} min')
    for kind in ('bbox', 'segm'):
        print(f'  {kind} mAP: {metrics.get(f"coco/{kind}_mAP", float("nan")):.3f}   '
              f'(AP50 {metrics.get(f"coco/{kind}_mAP_50", float("nan")):.3f})')
    print(f'  checkpoint: {checkpoint}')
    print(f'  training log: {log_file}')
    print(f'  metrics JSON: {metrics_file}')
    print(f'  predictions drawn: {osp.dirname(pictures[0]) if pictures else "(none)"} '
          f'({len(pictures)} images)')
    print('=' * 72)
    return dict(metrics=metrics, checkpoint=checkpoint, metrics_file=metrics_file,
                pictures=pictures)


if __name__ == '__main__':
    main()
