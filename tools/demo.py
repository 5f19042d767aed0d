#!/usr/bin/env python
"""The main job: train Mask R-CNN + SEMA-T on generated shapes, evaluate it, draw predictions.

Runs the same tools a user runs (tools/train.py, tools/test.py) on a COCO-format dataset that
the project generates deterministically (no download), so it doubles as an end-to-end check:

    python tools/demo.py                        # ~15 minutes on 2 CPU cores
    python tools/demo.py --epochs 1 --num-train 16 --num-val 8   # a quick smoke run

Re-running resumes an interrupted training from its last checkpoint.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
DEMO_CONFIG = osp.join(ROOT, 'configs', 'demo', 'mask-rcnn_sema-t_fpn_shapes.py')


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'),
                   help='checkpoints, logs, metrics and pictures go here')
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
    options = {
        'train_dataloader.dataset.data_root': root,
        'val_dataloader.dataset.data_root': root,
        'test_dataloader.dataset.data_root': root,
        'val_evaluator.ann_file': root + 'annotations/instances_val2017.json',
        'test_evaluator.ann_file': root + 'annotations/instances_val2017.json',
        'randomness.seed': args.seed,
    }
    if args.epochs is not None:
        options.update({'train_cfg.max_epochs': args.epochs, 'train_cfg.val_interval': args.epochs})
    cfg_opts = [f'{k}={v}' for k, v in options.items()]

    def log_dirs() -> set:
        if not osp.isdir(work_dir):
            return set()
        return {d for d in os.listdir(work_dir) if d[:8].isdigit()}

    # 2. train (resumes from the last checkpoint if a previous run was interrupted)
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
    print(f'Main job finished in {(time.time() - t0) / 60:.1f} min')
    print(f'  bbox mAP: {metrics.get("coco/bbox_mAP", float("nan")):.3f}   '
          f'(AP50 {metrics.get("coco/bbox_mAP_50", float("nan")):.3f})')
    print(f'  segm mAP: {metrics.get("coco/segm_mAP", float("nan")):.3f}   '
          f'(AP50 {metrics.get("coco/segm_mAP_50", float("nan")):.3f})')
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
