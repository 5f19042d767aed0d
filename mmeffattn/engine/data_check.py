"""Check that a config's datasets exist before anything is built: a wrong path fails at once
with the path, the config key and the fix, not minutes later inside a dataset class."""
import json
import os.path as osp
from pathlib import Path
from typing import Iterable, Iterator, List, NamedTuple, Tuple

from mmengine.config import Config, ConfigDict

#: annotation JSON files up to this size are parsed; larger ones get a check of their ends
FULL_JSON_CHECK_BYTES = 64 * 1024 * 1024

PHASE_EVALUATORS = {'train': ('val_evaluator',), 'val': ('val_evaluator',),
                    'test': ('test_evaluator',)}
PHASE_LOADERS = {'train': ('train_dataloader', 'val_dataloader'), 'val': ('val_dataloader',),
                 'test': ('test_dataloader',)}
#: paths that are not local files, and so are not checked
_REMOTE = ('s3:', 'http:', 'https:', 'petrel:')


class DatasetPath(NamedTuple):
    """A path one dataset config needs: ``dataset[field]`` resolved against its ``data_root``."""
    dataset_key: str  # e.g. 'train_dataloader.dataset' (a wrapper's inner one: '...dataset')
    field: str  # 'data_root', 'ann_file' or 'data_prefix.<name>'
    path: str
    dataset: dict

    @property
    def key(self) -> str:
        return f'{self.dataset_key}.{self.field}'


def _dataset_paths(ds: dict, key: str) -> List[DatasetPath]:
    """The paths that must exist for one dataset config (wrappers' inner datasets included)."""
    if ds is None:
        return []
    if 'datasets' in ds:  # ConcatDataset and friends
        return [p for i, sub in enumerate(ds['datasets'])
                for p in _dataset_paths(sub, f'{key}.datasets[{i}]')]
    if 'dataset' in ds:  # RepeatDataset, ClassBalancedDataset, MultiImageMixDataset
        return _dataset_paths(ds['dataset'], f'{key}.dataset')
    root = ds.get('data_root') or ''
    out = []
    if root:
        out.append(DatasetPath(key, 'data_root', root, ds))
    ann = ds.get('ann_file')
    if ann:  # (an absolute ann_file is taken as it is)
        out.append(DatasetPath(key, 'ann_file', osp.join(root, ann), ds))
    prefix = ds.get('data_prefix') or {}
    for name, sub in (prefix.items() if isinstance(prefix, dict) else []):
        if isinstance(sub, str) and sub:
            out.append(DatasetPath(key, f'data_prefix.{name}', osp.join(root, sub), ds))
    return out


class AnnotationFileError(ValueError):
    """An annotation file exists but is not valid JSON; the message names the file."""


def check_annotation_json(path: str, key: str = 'ann_file') -> None:
    """Raise :class:`AnnotationFileError` naming ``path`` when it is not valid JSON (small files
    parsed, large ones checked for ``{...}`` or ``[...]`` ends)."""
    fix = (f'regenerate or download it again, or point {key} at a valid COCO-style JSON file')
    size = osp.getsize(path)
    if size == 0:
        raise AnnotationFileError(f'annotation file {path!r} ({key}) is empty: {fix}')
    if size <= FULL_JSON_CHECK_BYTES:
        try:
            json.loads(Path(path).read_bytes())
        except ValueError as e:  # (UnicodeDecodeError included)
            raise AnnotationFileError(
                f'annotation file {path!r} ({key}) is not valid JSON ({e}): {fix}') from None
        return
    with open(path, 'rb') as f:
        head = f.read(256).lstrip()[:1]
        f.seek(max(0, size - 256))
        tail = f.read().rstrip()[-1:]
    if (head, tail) not in ((b'{', b'}'), (b'[', b']')):
        raise AnnotationFileError(
            f'annotation file {path!r} ({key}) is not valid JSON (it starts with {head!r} and '
            f'ends with {tail!r}: truncated or not JSON): {fix}')


def _loader_paths(cfg: Config, phases: Iterable[str]) -> Iterator[DatasetPath]:
    """Every dataset path of the dataloaders ``phases`` use."""
    for phase in phases:
        for loader_key in PHASE_LOADERS[phase]:
            loader = cfg.get(loader_key)
            if isinstance(loader, (dict, ConfigDict)) and loader.get('dataset') is not None:
                yield from _dataset_paths(loader['dataset'], f'{loader_key}.dataset')


def _evaluator_ann_files(cfg: Config, phases: Iterable[str]) -> Iterator[Tuple[str, str]]:
    """``(config key, path)`` of each evaluator annotation file of ``phases``, once each."""
    for ev_key in dict.fromkeys(k for phase in phases for k in PHASE_EVALUATORS[phase]):
        evaluators = cfg.get(ev_key)
        many = isinstance(evaluators, (list, tuple))
        for i, ev in enumerate(evaluators if many else [evaluators]):
            if isinstance(ev, (dict, ConfigDict)) and isinstance(ev.get('ann_file'), str):
                yield f'{ev_key}[{i}].ann_file' if many else f'{ev_key}.ann_file', ev['ann_file']


def check_annotation_files(cfg: Config, phases: Iterable[str]) -> None:
    """:func:`check_annotation_json` on every annotation file of ``phases``' datasets and
    evaluators."""
    phases, seen = list(phases), set()
    files = [(p.key, p.path) for p in _loader_paths(cfg, phases) if p.field == 'ann_file']
    for key, path in files + list(_evaluator_ann_files(cfg, phases)):
        if (path.lower().endswith('.json') and path not in seen and osp.isfile(path)
                and not path.startswith(_REMOTE)):
            seen.add(path)
            check_annotation_json(path, key)


def _missing_paths_fix(cfg: Config, missing: List[DatasetPath], phases: Iterable[str]) -> str:
    """How to fix ``missing`` paths: the config keys of each dataset's ``data_root`` and of the
    evaluators' annotation files."""
    datasets = {p.dataset_key: p.dataset for p in missing}  # (in order, once each)
    types = sorted({str(ds.get('type', '')).split('.')[-1] for ds in datasets.values()} - {''})
    options = [f'{key}.data_root=/path/to/dataset/' for key in datasets]
    # the datasets' own annotation files, relative to their roots (COCO's evaluator repeats one)
    anns = [str(ds.get('ann_file') or '') for ds in datasets.values()]
    for key, path in _evaluator_ann_files(cfg, phases):
        if '[' not in key:  # (a list's entries have no --cfg-options key)
            ann = next((a for a in anns if a and not osp.isabs(a) and path.endswith(a)), None)
            options.append(f'{key}=' + (f'/path/to/dataset/{ann}' if ann else
                                        '/path/to/annotations.json'))
    layout = f' (the layout {" / ".join(types)} expects)' if types else ''
    return (f'Put the dataset there{layout}, or point the config at it, e.g. --cfg-options '
            + ' '.join(options))


def check_dataset_paths(cfg: Config, phases: Iterable[str]) -> None:
    """Raise ``FileNotFoundError`` naming every missing dataset path of ``phases`` and the keys
    that fix it, and :class:`AnnotationFileError` for an annotation file that is not JSON."""
    phases = list(phases)
    unique = {(p.key, p.path): p for p in _loader_paths(cfg, phases)}  # (in order, once each)
    missing = [p for p in unique.values() if not p.path.startswith(_REMOTE)
               and not osp.exists(p.path)]
    if missing:
        lines = '\n'.join(f'  {p.key} = {p.path!r}' for p in missing)
        raise FileNotFoundError('dataset paths in the config do not exist:\n' + lines + '\n'
                                + _missing_paths_fix(cfg, missing, phases))
    check_annotation_files(cfg, phases)
