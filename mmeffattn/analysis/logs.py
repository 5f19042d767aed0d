"""Reading the ``<work_dir>/<timestamp>/vis_data/scalars.json`` logs that training writes, for
``tools/analysis_tools/analyze_logs.py``: a work dir is one history, its runs in time order, each
replacing what earlier runs logged from its first iteration on (resumes).
"""
import glob
import json
import os.path as osp
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = ['TrainLog', 'find_scalar_files', 'read_scalars', 'load_log', 'train_time']

#: keys that locate a line rather than measure something
POSITION_KEYS = ('step', 'iter', 'epoch')


@dataclass
class TrainLog:
    """A training history: the ``scalars.json`` ``sources`` read, ``train`` and ``val`` lines
    sorted by ``step`` (validation at its epoch when ``by_epoch``), ``skipped`` files and why."""
    sources: List[str]
    train: List[dict]
    val: List[dict]
    by_epoch: bool
    skipped: List[Tuple[str, str]] = field(default_factory=list)

    def keys(self) -> Dict[str, List[str]]:
        """The logged quantities, per kind of line (``'train'``, ``'val'``)."""
        out = {}
        for kind, lines in (('train', self.train), ('val', self.val)):
            seen = dict.fromkeys(k for line in lines for k in line if k not in POSITION_KEYS)
            out[kind] = list(seen)
        return out

    def series(self, key: str,
               kind: Optional[str] = None) -> Tuple[List[float], List[float], str]:
        """``(x, y, x_label)`` of one logged quantity (x: iteration, or validation epoch); ``kind``
        picks ``'train'``/``'val'`` lines (default: training lines for keys logged in both)."""
        for name, lines in (('train', self.train), ('val', self.val)):
            if kind not in (None, name):
                continue
            points = [(line['step'], line[key]) for line in lines if key in line]
            if points:
                label = 'iteration' if name == 'train' or not self.by_epoch else 'epoch'
                return [p[0] for p in points], [float(p[1]) for p in points], label
        keys = self.keys()
        raise KeyError(f'{key!r} is not in the log ({", ".join(self.sources)}); training keys: '
                       f'{", ".join(keys["train"]) or "none"}; validation keys: '
                       f'{", ".join(keys["val"]) or "none"}')


def find_scalar_files(path: str) -> List[str]:
    """The ``scalars.json`` files behind ``path`` (a file, a run's folder or a work dir), oldest
    first."""
    if osp.isfile(path):
        return [path]
    if not osp.isdir(path):
        raise FileNotFoundError(f'{path} does not exist: give a work dir (tools/train.py '
                                f'--work-dir) or a vis_data/scalars.json file')
    own = osp.join(path, 'vis_data', 'scalars.json')
    files = [own] if osp.isfile(own) else sorted(
        glob.glob(osp.join(path, '*', 'vis_data', 'scalars.json')))
    if not files:
        raise FileNotFoundError(f'no */vis_data/scalars.json under {path}: is it a work dir '
                                f'of tools/train.py, and has training logged anything yet?')
    return files


def read_scalars(path: str) -> List[dict]:
    """The JSON lines of one ``scalars.json``. A line cut off at the end (a run killed while
    writing) is dropped; a bad line elsewhere is an error naming it."""
    with open(path) as f:
        raw = f.read().splitlines()
    lines = []
    for i, text in enumerate(raw):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as e:
            if i == len(raw) - 1:  # the last line of a killed run may be partial
                continue
            raise ValueError(f'{path}, line {i + 1}: not JSON ({e})') from None
        if not isinstance(line, dict) or 'step' not in line:
            raise ValueError(f'{path}, line {i + 1}: not an mmengine scalar line (a JSON '
                             f'object with a "step")')
        lines.append(line)
    return lines


def _runs(lines: List[dict]) -> List[List[dict]]:
    """Split one file's lines where the training step goes back (two runs started in the same
    second share a folder)."""
    runs, last = [[]], None
    for line in lines:
        if 'iter' in line:
            if last is not None and line['step'] <= last:
                runs.append([])
            last = line['step']
        runs[-1].append(line)
    return runs


def load_log(path: str) -> TrainLog:
    """Read a work dir (all its training runs) or one ``scalars.json`` as one history; a
    validation line goes where the training line before it is (its epoch or iteration)."""
    sources, skipped = [], []
    train: Dict[int, dict] = {}
    val: Dict[int, dict] = {}
    by_epoch = False
    for file in find_scalar_files(path):
        lines = read_scalars(file)
        if not any('iter' in line for line in lines):
            skipped.append((file, 'no training lines (a test run?)'))
            continue
        sources.append(file)
        for run in _runs(lines):
            run_train = [line for line in run if 'iter' in line]
            if not run_train:
                continue
            run_by_epoch = 'epoch' in run_train[0]
            by_epoch = by_epoch or run_by_epoch
            # a resumed run replaces what earlier runs logged from where it begins
            first = run_train[0]
            position = first['epoch'] - 1 if run_by_epoch else first['step'] - 1
            train = {s: line for s, line in train.items() if s < first['step']}
            val = {s: line for s, line in val.items() if s <= position}
            for line in run:
                if 'iter' in line:
                    train[line['step']] = line
                    position = line['epoch'] if run_by_epoch else line['step']
                else:
                    val[position] = dict(line, step=position)
    if not sources:
        raise ValueError(f'no training run logged under {path}: '
                         + '; '.join(f'{f}: {why}' for f, why in skipped))
    return TrainLog(sources, [train[s] for s in sorted(train)], [val[s] for s in sorted(val)],
                    by_epoch, skipped)


def train_time(log: TrainLog) -> dict:
    """Seconds per iteration: the mean of the logged ``time`` per epoch (one group for an
    iteration-based loop), the slowest and fastest epoch, their spread and the overall mean."""
    groups: Dict[int, List[float]] = {}
    for line in log.train:
        if 'time' in line:
            groups.setdefault(line.get('epoch', 0), []).append(float(line['time']))
    if not groups:
        raise ValueError(f'no "time" in the training lines of {", ".join(log.sources)}')
    per_epoch = {e: statistics.fmean(t) for e, t in sorted(groups.items())}
    slowest = max(per_epoch, key=per_epoch.get)
    fastest = min(per_epoch, key=per_epoch.get)
    values = list(per_epoch.values())
    return dict(per_epoch=per_epoch, slowest=(slowest, per_epoch[slowest]),
                fastest=(fastest, per_epoch[fastest]),
                std=statistics.pstdev(values) if len(values) > 1 else 0.,
                mean=statistics.fmean(t for ts in groups.values() for t in ts),
                by_epoch=log.by_epoch)
