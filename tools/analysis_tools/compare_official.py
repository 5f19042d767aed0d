#!/usr/bin/env python
"""Forward latency of our backbones against the papers' official model code, on this machine.

    python tools/analysis_tools/compare_official.py --mlla-root PATH/TO/MLLA --sizes 224 512 1024
    python tools/analysis_tools/compare_official.py --veca-root PATH/TO/VECA --sizes 224 512 768
    python tools/analysis_tools/compare_official.py --weightformer-root PATH/TO/WeightFormer

The official code is imported from a checkout you point to (each needs ``pip install
timm==0.4.12``). Before timing, each official model gets seeded random weights, ours loads them
through our checkpoint filter, and the outputs must agree to ``--tol`` (``--no-check`` skips
this). Both run on the CPU, batch 1, eval mode without grad (``--train``: a training step, all
stochastic layers off), timed call by call in alternation for ``--rounds`` rounds; each ratio is
the median of neighbouring calls' ratios.
"""
import argparse
import importlib.util
import json
import os.path as osp
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

import torch
import torch.nn as nn

from mmeffattn.analysis.benchmarking import backward_of_outputs, environment
from mmeffattn.analysis.comparison import check_outputs, time_paired

# WeightFormer's model/wfm.py factories (wfm_tiny, wfm_small): patch 16, depth 17, mlp ratio 4
WFM_DIMS = {'tiny': 192, 'small': 384}


def _load(path: str, name: str):
    """Import the file ``path`` as module ``name`` (with its folder importable for its own
    imports)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} not found: pass the root of an official checkout')
    sys.path.insert(0, osp.dirname(osp.dirname(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Comparison:
    """One official model against ours at one size: ``timed`` forwards (the official first),
    the ``models`` behind them, and the ``outputs`` to compare (empty with ``--no-check``)."""
    timed: Dict[str, Callable[[], object]]
    models: Dict[str, nn.Module]
    outputs: Dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)

    def training_steps(self) -> Dict[str, Callable[[], None]]:
        """``timed`` as training steps: each model in train mode, forward, backward."""
        steps = {}
        for name, fn in self.timed.items():
            model = self.models[name].train()

            def step(fn=fn, model=model) -> None:
                model.zero_grad(set_to_none=True)
                backward_of_outputs(fn())

            steps[name] = step
        return steps


def perturb_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Add seeded noise (std 0.02) to every parameter: no init value hides a wrongly mapped
    tensor."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def mlla_pairs(root: str, side: int, check: bool = True) -> List[Comparison]:
    from mmeffattn.models.backbones import MILA, SEMA
    from mmeffattn.models.backbones.sema import checkpoint_filter_mlla
    mlla = _load(osp.join(root, 'models', 'mlla.py'), 'official_mlla')
    # MLLA-T (cfgs/mlla_t.yaml); its RoPE table is fixed at construction, so build per size
    off = mlla.MLLA(img_size=side, embed_dim=64, depths=[2, 4, 8, 4], num_heads=[2, 4, 8, 16],
                    drop_path_rate=0.).eval()
    ours = MILA(arch='tiny', out_indices=(3, ), drop_path_rate=0.).eval()
    sema = SEMA(arch='tiny', out_indices=(3, ), drop_path_rate=0.,
                attn_backend='reference').eval()
    x = torch.randn(1, 3, side, side)
    cmp = Comparison({'official MLLA-T': lambda: off.forward_features(x),
                      'MILA-T': lambda: ours(x), 'SEMA-T': lambda: sema(x)},
                     {'official MLLA-T': off, 'MILA-T': ours, 'SEMA-T': sema})
    if check:
        perturb_(off)
        # the official forward_features ends with the classification norm and token mean:
        # norm3 here, then the mean of the map
        ours.load_state_dict(checkpoint_filter_mlla(off.state_dict(), final_norm='norm3'))
        cmp.outputs = {'official MLLA-T': lambda: off.forward_features(x),
                       'MILA-T': lambda: ours(x)[0].mean((2, 3))}
    return [cmp]


def veca_pairs(root: str, side: int, check: bool = True,
               family: str = 'small') -> List[Comparison]:
    from mmeffattn.models.backbones import VECA
    from mmeffattn.models.backbones.veca import checkpoint_filter_veca
    sys.path.insert(0, root)  # veca/model.py imports its package by name
    from veca.config import PretrainConfig, apply_family_preset
    from veca.model import VECA as OfficialVECA
    cfg = PretrainConfig()
    cfg.model_family = family
    apply_family_preset(cfg)
    cfg.init_patch_from_dinov3 = False  # no download
    cfg.distill_output_dim = None
    off = OfficialVECA(cfg).eval()
    ours = VECA(arch=family, out_type='raw', num_cores=cfg.num_query_tokens,
                nested_dropout=False, attn_backend='reference').eval()
    x = torch.randn(1, 3, side, side)
    name = f'VECA-{family}'
    cmp = Comparison({f'official {name}': lambda: off(x), name: lambda: ours(x)},
                     {f'official {name}': off, name: ours})
    if check:
        perturb_(off)
        ours.load_state_dict(checkpoint_filter_veca(off.state_dict()))

        def flat(out) -> torch.Tensor:  # (global [B, D], patches [B, N, D]) -> one vector
            return torch.cat([t.flatten() for t in out])

        cmp.outputs = {f'official {name}': lambda: flat(off(x)), name: lambda: flat(ours(x))}
    return [cmp]


def weightformer_pairs(root: str, side: int, check: bool = True,
                       archs: Sequence[str] = ('tiny', 'small')) -> List[Comparison]:
    from mmeffattn.models.backbones import WeightFormer
    from mmeffattn.models.backbones.weightformer import checkpoint_filter_weightformer
    wfm = _load(osp.join(root, 'model', 'wfm.py'), 'official_wfm')
    x = torch.randn(1, 3, side, side)
    cmps = []
    for arch in archs:
        # the class itself with the factory's arguments: newer timm's build_model_with_cfg
        # rejects the default_cfg the official factories pass; its PatchEmbed fixes the size
        off = wfm.VisionTransformer(img_size=side, patch_size=16, embed_dim=WFM_DIMS[arch],
                                    depth=17).eval()
        ours = WeightFormer(arch=arch, out_indices=(-1, ), out_type='avgpool',
                            attn_backend='reference').eval()
        name = f'WeightFormer-{arch[0].upper()}'
        cmp = Comparison({f'official {name}': lambda off=off: off.forward_features(x),
                          name: lambda ours=ours: ours(x)}, {f'official {name}': off, name: ours})
        if check:
            perturb_(off)
            ours.load_state_dict(checkpoint_filter_weightformer(off.state_dict()))
            cmp.outputs = {f'official {name}': lambda off=off: off.forward_features(x),
                           name: lambda ours=ours: ours(x)[0]}
        cmps.append(cmp)
    return cmps


def main(argv=None) -> List[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--mlla-root', help='checkout of github.com/LeapLabTHU/MLLA')
    p.add_argument('--veca-root', help='checkout of github.com/alansong1322/VECA')
    p.add_argument('--weightformer-root', help='checkout of github.com/LeapLabTHU/WeightFormer')
    p.add_argument('--sizes', type=int, nargs='+', default=[224, 512])
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--rounds', type=int, default=12,
                   help='timed calls of each model, alternating (after one warm-up call)')
    p.add_argument('--train', action='store_true',
                   help='time training steps (forward + backward in train mode), not forwards')
    p.add_argument('--tol', type=float, default=1e-4,
                   help='largest relative output difference accepted by the check')
    p.add_argument('--no-check', action='store_true',
                   help='time only; do not check that ours reproduces the official outputs')
    p.add_argument('--json', help='write the rows to this file')
    args = p.parse_args(argv)
    makers = [(args.mlla_root, mlla_pairs), (args.veca_root, veca_pairs),
              (args.weightformer_root, weightformer_pairs)]
    if not any(root for root, _ in makers):
        p.error('pass --mlla-root, --veca-root and/or --weightformer-root (official checkouts)')
    torch.set_num_threads(args.threads)
    import mmeffattn  # noqa: F401
    rows = []
    for side in args.sizes:
        for root, make in makers:
            if not root:
                continue
            torch.manual_seed(0)
            for cmp in make(root, side, check=not args.no_check):
                diffs = check_outputs(cmp.outputs, args.tol) if cmp.outputs else {}
                if args.train:
                    ms, ratio = time_paired(cmp.training_steps(), args.rounds)
                else:
                    with torch.no_grad():
                        ms, ratio = time_paired(cmp.timed, args.rounds)
                ref = next(iter(ms))
                line = ', '.join(f'{k} {v:.1f} ms ({ratio[k]:.2f}x)' for k, v in ms.items())
                same = ''.join(f'; {k} output within {v:.1e} of official' for k, v in diffs.items())
                print(f'{side}x{side}: {line}{same}', flush=True)
                rows.append(dict(size=side, mode='train' if args.train else 'eval', ms=ms,
                                 ratio=ratio, reference=ref, output_diff=diffs))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(environment=environment(torch.device('cpu'), torch.float32),
                           rounds=args.rounds, tol=None if args.no_check
                           else args.tol, rows=rows), f, indent=1)
    return rows


if __name__ == '__main__':
    main()
