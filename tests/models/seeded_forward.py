"""Seeded forwards of every backbone family, saved as small fixtures (tests/models/fixtures/).

A refactor of the model code must keep parameter counts and outputs: ``test_seeded_forward.py``
rebuilds each case, fills every parameter and buffer from its *name* (so a change in
construction order changes nothing), runs one seeded odd-sized input in eval mode with the ops'
PyTorch references and compares with the saved fixture.

Regenerate the fixtures deliberately (only when an output change is intended, and say so in the
commit), from the project root::

    PYTHONPATH=$PWD python tests/models/seeded_forward.py            # every case
    PYTHONPATH=$PWD python tests/models/seeded_forward.py NAME ...   # only these cases (new ones)
"""
import math
import os
import os.path as osp
import sys
import zlib
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn

FIXTURES = osp.join(osp.dirname(osp.abspath(__file__)), 'fixtures')
INPUT_SHAPE = (1, 3, 45, 61)  # odd on both sides: exercises every padding/partial-window path
MAX_SAMPLES = 4096  # values kept per output (a strided subset of large outputs)


def _cases() -> Dict[str, Callable[[], nn.Module]]:
    from mmeffattn.models.backbones import MILA, SEMA, VECA, LaplacianFormer, WeightFormer
    return {
        'sema_tiny': lambda: SEMA(arch='tiny'),
        'mila_tiny': lambda: MILA(arch='tiny'),
        'weightformer_tiny_featmap': lambda: WeightFormer(arch='tiny', out_type='featmap'),
        'weightformer_tiny_avgpool': lambda: WeightFormer(arch='tiny', out_type='avgpool'),
        'weightformer_tiny_pyramid': lambda: WeightFormer(arch='tiny', out_type='pyramid',
                                                          out_indices=(8, )),
        # the model before whitening='kernel' became the default (its fixture is unchanged)
        'laplacianformer_tiny': lambda: LaplacianFormer(arch='tiny', whitening='query',
                                                        feature_scale='sqrt_head_dim'),
        # the default since issue 11: the paper's kernel whitening, no feature scale
        'laplacianformer_tiny_kernel': lambda: LaplacianFormer(arch='tiny'),
        'veca_small_raw': lambda: VECA(arch='small'),
        'veca_small_pyramid': lambda: VECA(arch='small', out_type='pyramid', num_cores=16),
    }


def case_names() -> List[str]:
    return sorted(_cases())


@torch.no_grad()
def fill_by_name(model: nn.Module) -> None:
    """Deterministic, small-scale values for every persistent parameter and buffer, each drawn
    from a generator seeded with the CRC32 of its name."""
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            continue  # e.g. BatchNorm's num_batches_tracked
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        r = torch.randn(t.shape, generator=gen)
        if name.endswith('running_var'):
            v = 0.5 + r.abs()
        elif t.dim() <= 1 and name.endswith('weight'):
            v = 1. + 0.1 * r  # norm scales
        elif t.dim() <= 1:
            v = 0.02 * r  # biases, means, scalars
        else:
            v = r / math.sqrt(max(t[0].numel(), 1))  # fan-in scaled
        t.copy_(v)


def seeded_input() -> torch.Tensor:
    return torch.randn(INPUT_SHAPE, generator=torch.Generator().manual_seed(2024))


def summarize(outs) -> List[Dict[str, torch.Tensor]]:
    """Per output: its shape, a strided subset of its values and its sum / absolute sum."""
    if torch.is_tensor(outs):
        outs = (outs, )
    result = []
    for o in outs:
        flat = o.detach().float().reshape(-1)
        stride = max(1, math.ceil(flat.numel() / MAX_SAMPLES))
        result.append(dict(shape=torch.tensor(o.shape), values=flat[::stride].clone(),
                           stride=torch.tensor(stride), sum=flat.double().sum(),
                           abs_sum=flat.double().abs().sum()))
    return result


def run_case(name: str) -> dict:
    """Build, fill, run case ``name`` on the ops' references; returns what the fixture holds."""
    os.environ['MMEFFATTN_OPS_BACKEND'] = 'reference'
    model = _cases()[name]().eval()
    fill_by_name(model)
    n_params = sum(p.numel() for p in model.parameters())
    n_state = sum(t.numel() for t in model.state_dict().values())
    outs = model(seeded_input())
    return dict(n_params=n_params, n_state=n_state, outputs=summarize(outs))


def fixture_path(name: str) -> str:
    return osp.join(FIXTURES, f'{name}.pt')


def regenerate(names: Optional[List[str]] = None) -> None:
    """Write the fixtures of ``names`` (default: every case; fp32). Run deliberately; see the
    module docstring."""
    unknown = sorted(set(names or []) - set(case_names()))
    if unknown:
        raise SystemExit(f'unknown case(s) {unknown}; the cases are {case_names()}')
    torch.set_num_threads(1)
    os.makedirs(FIXTURES, exist_ok=True)
    for name in names or case_names():
        with torch.no_grad():
            data = run_case(name)
        torch.save(data, fixture_path(name))
        print(f'{name}: {data["n_params"]} parameters, '
              f'{len(data["outputs"])} outputs -> {fixture_path(name)}')


if __name__ == '__main__':
    regenerate(sys.argv[1:])
