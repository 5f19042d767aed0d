"""Ours against official code: outputs within a tolerance, times in alternation."""
import statistics
from typing import Callable, Dict, List, Tuple

import torch

from .benchmarking import time_once

MISMATCH_HINT = 'the checkpoint filter or the architecture does not match this official checkout'


def check_outputs(outputs: Dict[str, Callable[[], torch.Tensor]], tol: float,
                  hint: str = MISMATCH_HINT) -> Dict[str, float]:
    """Largest difference of each output from the first (the official one), relative to its
    largest magnitude; a ``RuntimeError`` ending with ``hint`` beyond ``tol``."""
    items = iter(outputs.items())
    ref_name, ref_fn = next(items)
    with torch.no_grad():
        ref = ref_fn().float()
        diffs = {}
        for name, fn in items:
            out = fn().float()
            if out.shape != ref.shape:
                raise RuntimeError(f'{name} gives shape {tuple(out.shape)}, {ref_name} '
                                   f'{tuple(ref.shape)}: not the same model')
            diffs[name] = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    bad = {k: v for k, v in diffs.items() if not v <= tol}
    if bad:
        raise RuntimeError(f'with the weights of {ref_name}, ' + ', '.join(
            f'{k} differs by {v:.2e}' for k, v in bad.items()) + f' (relative; --tol {tol:g}): '
            + hint)
    return diffs


def time_paired(fns: Dict[str, Callable[[], object]], rounds: int,
                device: torch.device = torch.device('cpu')
                ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Time each function once per round for ``rounds`` rounds (after a warm-up, the order
    reversed every other round); returns the median ms per call of each and the median of its
    ratios to the first function in the same round (steadier than a ratio of medians)."""
    items = list(fns.items())
    for _, fn in items:
        fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for name, fn in (items if r % 2 == 0 else items[::-1]):
            times[name].append(time_once(fn, device))
    ref = times[items[0][0]]
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = {k: statistics.median(t / t0 for t, t0 in zip(v, ref)) for k, v in times.items()}
    return ms, ratio
