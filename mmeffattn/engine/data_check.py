"""Check that a config's datasets exist before anything is built.

A wrong path otherwise surfaces minutes later, deep inside a dataset class, after the model was
built; here it fails at once with the path, the config key and how to fix it.
"""
import os.path as osp
from typing import Iterable, List

from mmengine.config import Config, ConfigDict

PHASE_LOADERS = {
    'train': ('train_dataloader', 'val_dataloader'),
    'val': ('val_dataloader',),
    'test': ('test_dataloader',),
}


def _dataset_paths(ds: dict, key: str) -> List[tuple]:
    """(config key, path) pairs that must exist for one dataset config."""
    if ds is None:
        return []
    if 'datasets' in ds:  # ConcatDataset and friends
        out = []
        for i, sub in enumerate(ds['datasets']):
            out += _dataset_paths(sub, f'{key}.datasets[{i}]')
        return out
    if 'dataset' in ds:  # RepeatDataset, ClassBalancedDataset, MultiImageMixDataset
        return _dataset_paths(ds['dataset'], f'{key}.dataset')
    root = ds.get('data_root') or ''
    out = []
    if root:
        out.append((f'{key}.data_root', root))
    ann = ds.get('ann_file')
    if ann:
        out.append((f'{key}.ann_file', osp.join(root, ann) if not osp.isabs(ann) else ann))
    prefix = ds.get('data_prefix') or {}
    for name, sub in (prefix.items() if isinstance(prefix, dict) else []):
        if isinstance(sub, str) and sub:
            out.append((f'{key}.data_prefix.{name}', osp.join(root, sub)))
    return out


def check_dataset_paths(cfg: Config, phases: Iterable[str]) -> None:
    """Raise ``FileNotFoundError`` naming every missing dataset path used by ``phases``."""
    missing = []
    seen = set()
    for phase in phases:
        for loader_key in PHASE_LOADERS[phase]:
            loader = cfg.get(loader_key)
            if not isinstance(loader, (dict, ConfigDict)) or loader.get('dataset') is None:
                continue
            for key, path in _dataset_paths(loader['dataset'], f'{loader_key}.dataset'):
                if path.startswith(('s3:', 'http:', 'https:', 'petrel:')) or (key, path) in seen:
                    continue
                seen.add((key, path))
                if not osp.exists(path):
                    missing.append((key, path))
    if missing:
        lines = '\n'.join(f'  {key} = {path!r}' for key, path in missing)
        raise FileNotFoundError(
            'dataset paths in the config do not exist:\n' + lines + '\n'
            'Put the dataset there (OpenMMLab layout, e.g. data/coco/ with annotations/, '
            'train2017/, val2017/), or point the config at it, e.g. '
            '--cfg-options train_dataloader.dataset.data_root=/path/to/coco/ '
            'val_dataloader.dataset.data_root=/path/to/coco/ '
            'val_evaluator.ann_file=/path/to/coco/annotations/instances_val2017.json')
