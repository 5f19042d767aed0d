#!/usr/bin/env python
"""Forward latency of our backbones against the papers' official model code, on this machine.

    python tools/analysis_tools/compare_official.py --mlla-root PATH/TO/MLLA --sizes 224 512 1024
    python tools/analysis_tools/compare_official.py --veca-root PATH/TO/VECA --sizes 224 512 768

The official code is imported from a checkout you point to (github.com/LeapLabTHU/MLLA,
``models/mlla.py``; github.com/alansong1322/VECA, ``veca/model.py``; both import timm:
``pip install timm``); nothing of it is in this project. Both sides get the same architecture
with random weights, eval mode, batch 1, no grad, ``--threads`` threads, on the CPU (our ops run
their PyTorch references, the CPU path, never Triton's interpreter), and are timed in
alternating blocks (median of all runs), so drift hits both alike. On a shared machine the
spread between processes is several percent: repeat the command before reading a difference
of that size.
"""
import argparse
import importlib.util
import os.path as osp
import statistics
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402


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


def time_alternating(fns: Dict[str, Callable[[], object]], blocks: int,
                     runs: int) -> Dict[str, float]:
    """Median ms per call of each function, timed in ``blocks`` rounds of ``runs`` calls each
    (one warm-up call per block), the order reversed every other round."""
    times: Dict[str, List[float]] = {k: [] for k in fns}
    items = list(fns.items())
    for b in range(blocks):
        for name, fn in (items if b % 2 == 0 else items[::-1]):
            fn()
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def mlla_pairs(root: str, side: int) -> Dict[str, Callable[[], object]]:
    from mmeffattn.models.backbones import MILA, SEMA
    mlla = _load(osp.join(root, 'models', 'mlla.py'), 'official_mlla')
    # MLLA-T (cfgs/mlla_t.yaml); its RoPE table is fixed at construction, so build per size
    off = mlla.MLLA(img_size=side, embed_dim=64, depths=[2, 4, 8, 4],
                    num_heads=[2, 4, 8, 16]).eval()
    ours = MILA(arch='tiny', out_indices=(3, )).eval()
    sema = SEMA(arch='tiny', out_indices=(3, ), attn_backend='reference').eval()
    x = torch.randn(1, 3, side, side)
    return {'official MLLA-T': lambda: off.forward_features(x), 'MILA-T': lambda: ours(x),
            'SEMA-T': lambda: sema(x)}


def veca_pairs(root: str, side: int, family: str = 'small') -> Dict[str, Callable[[], object]]:
    from mmeffattn.models.backbones import VECA
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
                attn_backend='reference').eval()
    x = torch.randn(1, 3, side, side)
    return {f'official VECA-{family}': lambda: off(x), f'VECA-{family}': lambda: ours(x)}


def main(argv=None) -> List[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--mlla-root', help='checkout of github.com/LeapLabTHU/MLLA')
    p.add_argument('--veca-root', help='checkout of github.com/alansong1322/VECA')
    p.add_argument('--sizes', type=int, nargs='+', default=[224, 512])
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--blocks', type=int, default=4)
    p.add_argument('--runs', type=int, default=3)
    args = p.parse_args(argv)
    if not (args.mlla_root or args.veca_root):
        p.error('pass --mlla-root and/or --veca-root (official checkouts)')
    torch.set_num_threads(args.threads)
    import mmeffattn  # noqa: F401
    rows = []
    for side in args.sizes:
        for root, make in ((args.mlla_root, mlla_pairs), (args.veca_root, veca_pairs)):
            if not root:
                continue
            fns = make(root, side)
            with torch.no_grad():
                ms = time_alternating(fns, args.blocks, args.runs)
            ref = next(k for k in ms if k.startswith('official'))
            line = ', '.join(f'{k} {v:.1f} ms ({v / ms[ref]:.2f}x)' for k, v in ms.items())
            print(f'{side}x{side}: {line}', flush=True)
            rows.append(dict(size=side, ms=ms, reference=ref))
    return rows


if __name__ == '__main__':
    main()
