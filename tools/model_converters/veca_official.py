#!/usr/bin/env python
"""Convert an official VECA checkpoint (github.com/alansong1322/VECA) to an mmeffattn checkpoint.

    python tools/model_converters/veca_official.py veca_small.pt veca-s_mmeffattn.pth

SRC is a checkpoint written by the official training scripts (a dict with the student's state
dict under ``student``, next to ``optimizer``, ``optimizer_muon``, ``scheduler``, ``config``...),
or a bare state dict. DST gets ``{'state_dict': ..., 'meta': ...}`` with ``backbone.*`` keys: they
load strictly (prefix ``backbone.``) into

    dict(type='mmeffattn.VECA', arch=ARCH, out_type='raw', patch_norm=..., out_proj_dims=...)

(the values are printed and stored in ``meta['backbone']``) and give the official outputs for
every number of active cores. The downstream configs of ``configs/veca`` load DST with
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')`` (the distillation
projection ``output_proj`` is then ignored, with a warning). The key mapping is
:func:`mmeffattn.models.backbones.veca.checkpoint_filter_veca_official`.
"""
import argparse
import os.path as osp
from typing import Optional, Sequence

import torch

from mmeffattn.models.backbones.veca import VECA, checkpoint_filter_veca_official

try:  # imported from the tools package
    from .converter_cli import (check_loads, load_official, parse_converter_args,
                                save_converted)
except ImportError:  # run as a script: its folder is on sys.path
    from converter_cli import (check_loads, load_official, parse_converter_args,
                               save_converted)


# official families (veca/config.py FAMILY_PRESETS) by (embed dims, depth, SwiGLU half width)
_FAMILIES = {(384, 12, 1024): 'small', (384, 12, 1536): 'splus', (768, 12, 2048): 'base',
             (1024, 24, 2730): 'large'}


def backbone_kwargs(state_dict: dict, official_cfg: Optional[dict] = None) -> dict:
    """The :class:`VECA` arguments under which the converted ``state_dict`` loads strictly."""
    official_cfg = official_cfg or {}
    dims = state_dict['backbone.patch_embed.proj.weight'].shape[0]
    depth = 1 + max(int(k.split('.')[2]) for k in state_dict if k.startswith('backbone.blocks.'))
    half = state_dict['backbone.blocks.0.ffn.fc2.weight'].shape[1]
    family = official_cfg.get('model_family') or _FAMILIES.get((dims, depth, half))
    if family is not None and family in VECA.arch_zoo:
        arch = family
        settings = VECA.arch_zoo[family]
        if (settings['embed_dims'], settings['depth']) != (dims, depth):
            raise ValueError(f'the checkpoint config says model_family={family!r}, but its '
                             f'weights have {dims} channels and {depth} blocks')
    else:
        if 'num_heads' not in official_cfg:
            raise ValueError(f'weights of no official family ({dims} channels, {depth} blocks, '
                             f'SwiGLU width {half}) and no num_heads in the checkpoint config: '
                             f'the number of heads cannot be read from the weights')
        arch = dict(embed_dims=dims, depth=depth, num_heads=int(official_cfg['num_heads']),
                    mlp_ratio=float(official_cfg.get('mlp_ratio', half / dims)))
    n_chunks = sum(k.startswith('backbone.core_tokens.') for k in state_dict)
    chunk = state_dict['backbone.core_tokens.0'].shape[1]
    kwargs = dict(arch=arch, out_type='raw', max_cores=n_chunks * chunk, core_chunk=chunk,
                  patch_norm='backbone.patch_embed.norm.weight' in state_dict)
    if 'backbone.output_proj.weight' in state_dict:
        kwargs['out_proj_dims'] = state_dict['backbone.output_proj.weight'].shape[0]
    return kwargs


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parse_converter_args(
        'Convert an official VECA checkpoint to an mmeffattn checkpoint with backbone.* keys '
        '(mmeffattn.VECA).', 'official checkpoint (.pt/.pth, weights under "student")', argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    ckpt = load_official(args.src, unsafe=args.unsafe_load)
    state_dict = checkpoint_filter_veca_official(ckpt)
    official_cfg = ckpt.get('config') if isinstance(ckpt, dict) else None
    kwargs = backbone_kwargs(state_dict, official_cfg if isinstance(official_cfg, dict) else None)
    with torch.device('meta'):  # strict check of the result, without building weights
        check_loads(VECA(**kwargs), state_dict)
    meta = dict(source=osp.basename(args.src), converted_from='alansong1322/VECA',
                backbone=dict(type='mmeffattn.VECA', **kwargs))
    for key in ('epoch', 'step', 'global_step'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), int):
            meta[key] = ckpt[key]
    save_converted(state_dict, meta, args.dst)
    print(f'{args.src} -> {args.dst}: {len(state_dict)} tensors; backbone {meta["backbone"]}')
    return meta


if __name__ == '__main__':
    main()
