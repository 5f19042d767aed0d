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
:func:`mmeffattn.models.backbones.weightformer.convert_weightformer`.
"""
import argparse
import os.path as osp
import pickle
import sys
from collections import OrderedDict
from typing import Optional, Sequence

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402

from mmeffattn.models.backbones.weightformer import convert_weightformer  # noqa: E402


class _TrainingConfig:
    """Stands in for the yacs ``CfgNode`` (a dict subclass) that the official script stores under
    ``config``, so the checkpoint loads with ``weights_only=True`` and without yacs: each node
    is read as a plain ``OrderedDict`` (the safe loader fills and builds only the standard dict
    types). The converter does not use it."""

    def __new__(cls, *args, **kwargs):
        return OrderedDict()


# (stand-in, pickled name) pairs accepted by the safe loader besides tensors and containers
_STAND_INS = [(_TrainingConfig, 'yacs.config.CfgNode')]


def load_official(path: str, unsafe: bool = False) -> dict:
    """Read an official checkpoint on the CPU (safe loading unless ``unsafe``)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'no checkpoint at {path!r}')
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    if unsafe:
        return torch.load(path, map_location='cpu', weights_only=False)
    try:
        with torch.serialization.safe_globals(_STAND_INS):
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:  # an object the safe loader refuses
        raise RuntimeError(
            f'{path!r} holds objects that torch.load(weights_only=True) refuses ({e}). If you '
            f'trust the file, rerun with --unsafe-load.') from e


def weightformer_arch(state_dict: dict) -> str:
    """The arch name for the converted weights (S and B share one architecture)."""
    dims = state_dict['backbone.patch_embed.proj.weight'].shape[0]
    return {192: 'tiny', 384: 'small (or base, trained at 448)'}.get(dims, f'embed_dims={dims}')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert an official WeightFormer checkpoint to an mmpretrain '
                    'ImageClassifier checkpoint (WeightFormer backbone, out_type="avgpool", '
                    'neck=None, LinearClsHead).')
    parser.add_argument('src', help='official checkpoint (.pth, or .safetensors)')
    parser.add_argument('dst', help='output checkpoint')
    parser.add_argument('--unsafe-load', action='store_true',
                        help='read SRC with torch.load(weights_only=False): only for files you '
                             'trust, when the safe loader refuses one')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    ckpt = load_official(args.src, unsafe=args.unsafe_load)
    state_dict = convert_weightformer(ckpt)
    meta = dict(source=osp.basename(args.src), converted_from='LeapLabTHU/WeightFormer',
                arch=weightformer_arch(state_dict))
    if isinstance(ckpt, dict) and isinstance(ckpt.get('epoch'), int):
        meta['epoch'] = ckpt['epoch']
    dst_dir = osp.dirname(osp.abspath(args.dst))
    if not osp.isdir(dst_dir):
        raise FileNotFoundError(f'output folder {dst_dir!r} does not exist')
    torch.save({'state_dict': state_dict, 'meta': meta}, args.dst)
    print(f'{args.src} -> {args.dst}: {len(state_dict)} tensors, arch {meta["arch"]}')
    return meta


if __name__ == '__main__':
    main()
