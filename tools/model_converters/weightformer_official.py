#!/usr/bin/env python
"""Convert an official WeightFormer checkpoint (github.com/LeapLabTHU/WeightFormer) to mmpretrain.

    python tools/model_converters/weightformer_official.py wfm-t.pth wfm-t_mmpretrain.pth

SRC is a checkpoint written by the official training script (a dict with the state dict under
``model``, next to ``optimizer``, ``lr_scheduler``, ``epoch``, ``config``...), a bare state dict,
or the Hugging Face Hub's ``model.safetensors`` (needs the ``safetensors`` package). DST gets
``{'state_dict': ..., 'meta': ...}`` with ``backbone.*``/``head.fc.*`` keys that load strictly into
the mmpretrain classifier::

    model = dict(type='ImageClassifier',
                 backbone=dict(type='mmeffattn.WeightFormer', arch='tiny', out_type='avgpool'),
                 neck=None,
                 head=dict(type='LinearClsHead', num_classes=1000, in_channels=192))

and give the official logits. The key mapping is
:func:`mmeffattn.models.backbones.weightformer.checkpoint_filter_weightformer_official`.
"""
import argparse
import os.path as osp
from typing import Optional, Sequence

import torch

from mmeffattn.engine.checkpoint_io import OFFICIAL_STAND_INS
from mmeffattn.models.backbones.weightformer import (
    WeightFormer, checkpoint_filter_weightformer_official)

try:  # imported from the tools package
    from .converter_cli import load_official as _load
    from .converter_cli import check_loads, parse_converter_args, save_converted
except ImportError:  # run as a script: its folder is on sys.path
    from converter_cli import load_official as _load
    from converter_cli import check_loads, parse_converter_args, save_converted


def load_official(path: str, unsafe: bool = False) -> dict:
    """Read an official checkpoint on the CPU (safe loading unless ``unsafe``)."""
    return _load(path, unsafe, stand_ins=OFFICIAL_STAND_INS)


def weightformer_arch(state_dict: dict) -> str:
    """The arch name for the converted weights (S and B share one architecture)."""
    dims = state_dict['backbone.patch_embed.proj.weight'].shape[0]
    return {192: 'tiny', 384: 'small (or base, trained at 448)'}.get(dims, f'embed_dims={dims}')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parse_converter_args(
        'Convert an official WeightFormer checkpoint to an mmpretrain ImageClassifier checkpoint '
        '(WeightFormer backbone, out_type="avgpool", neck=None, LinearClsHead).',
        'official checkpoint (.pth, or .safetensors)', argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    ckpt = load_official(args.src, unsafe=args.unsafe_load)
    state_dict = checkpoint_filter_weightformer_official(ckpt)
    dims = state_dict['backbone.patch_embed.proj.weight'].shape[0]
    depth = 1 + max(int(k.split('.')[2]) for k in state_dict if k.startswith('backbone.blocks.'))
    hidden = state_dict['backbone.blocks.0.mlp.fc1.weight'].shape[0]
    with torch.device('meta'):  # strict check of the backbone part, without building weights
        check_loads(WeightFormer(arch=dict(embed_dims=dims, depth=depth, mlp_ratio=hidden / dims),
                                 out_type='avgpool'), state_dict)
    meta = dict(source=osp.basename(args.src), converted_from='LeapLabTHU/WeightFormer',
                arch=weightformer_arch(state_dict))
    if isinstance(ckpt, dict) and isinstance(ckpt.get('epoch'), int):
        meta['epoch'] = ckpt['epoch']
    save_converted(state_dict, meta, args.dst)
    print(f'{args.src} -> {args.dst}: {len(state_dict)} tensors, arch {meta["arch"]}')
    return meta


if __name__ == '__main__':
    main()
