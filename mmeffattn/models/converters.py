"""The authors' published checkpoints (MLLA, WeightFormer, VECA) as whole mmpretrain classifiers:
:func:`model_checkpoint` (what tools/test.py and ``load_from`` load, strictly) and
:func:`convert_official` (an mmpretrain-style file; tools/model_converters are its command lines).
"""
import argparse
import os.path as osp
import re
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseTTAModel, is_model_wrapper

from ..engine.checkpoint_io import (OFFICIAL_STAND_INS, CheckpointError, atomic_save,
                                    install_checkpoint_io, load_checkpoint_file,
                                    open_checkpoint)
from ..registry import MODELS
from .backbones import sema, veca, weightformer
from .utils.pretrained import (keys_under, load_state_dict_strict, prefixes_of,
                               strip_module_prefix, unwrap_state_dict)


def is_official_mlla(ckpt: dict) -> bool:
    """Whether ``ckpt`` is an official MLLA classification checkpoint: MLLA's key names with the
    classifier ``head.*``, the classification norm ``norm.*`` or the fixed-size RoPE tables."""
    keys = list(strip_module_prefix(unwrap_state_dict(ckpt)))
    return any(re.match(r'layers\.\d+\.blocks\.\d+\.', k) for k in keys) and \
        any(k.startswith('patch_embed.conv1.') for k in keys) and \
        any(k.startswith(('head.', 'norm.')) or k.endswith('attn.rope.rotations') for k in keys)


def mlla_to_classifier(ckpt: dict, final_norm: str = 'norm3') -> dict:
    """An official MLLA checkpoint as ``ImageClassifier(MILA(out_indices=(3, )),
    GlobalAveragePooling, LinearClsHead)`` keys: the classification norm becomes the backbone's
    ``final_norm``, ``head`` the head's ``fc``."""
    sd = strip_module_prefix(unwrap_state_dict(ckpt))
    out = {'backbone.' + k: v for k, v in sema.checkpoint_filter_mlla(sd, final_norm).items()}
    out.update({'head.fc.' + k[len('head.'):]: v for k, v in sd.items() if k.startswith('head.')})
    return out


def mlla_backbone(sd: dict, ckpt: dict) -> Tuple[dict, str]:
    """The MILA config the converted backbone loads into, and its arch."""
    dims = sd['backbone.layers.0.blocks.0.norm1.weight'].numel()
    blocks = [m.group(1) for m in map(re.compile(r'backbone\.layers\.(\d)\.blocks\.\d+\.norm1\.'
                                                 r'weight').match, sd) if m]
    depths = [blocks.count(str(i)) for i in range(4)]
    arch = max((name for name, s in sema.MILA.arch_zoo.items()  # ('tiny', not its alias 't')
                if (s['embed_dims'], s['depths']) == (dims, depths)), key=len, default=None) or (
                dict(embed_dims=dims, depths=depths,
                     num_heads=[dims * 2**i // 32 for i in range(4)]))  # (MLLA: 32 per head)
    return dict(type='mmeffattn.MILA', arch=arch, out_indices=(3, )), str(arch)


def _width_depth(sd: dict) -> Tuple[int, int]:
    """The embedding width and block count of an isotropic backbone's ``backbone.*`` keys."""
    return (sd['backbone.patch_embed.proj.weight'].shape[0],
            1 + max(int(k.split('.')[2]) for k in sd if k.startswith('backbone.blocks.')))


def weightformer_backbone(sd: dict, ckpt: dict) -> Tuple[dict, str]:
    dims, depth = _width_depth(sd)
    hidden = sd['backbone.blocks.0.mlp.fc1.weight'].shape[0]
    arch = {192: 'tiny', 384: 'small (or base, trained at 448)'}.get(dims, f'embed_dims={dims}')
    return dict(type='mmeffattn.WeightFormer', out_type='avgpool',
                arch=dict(embed_dims=dims, depth=depth, mlp_ratio=hidden / dims)), arch


# official VECA families (veca/config.py FAMILY_PRESETS) by (embed dims, depth, SwiGLU half width)
_VECA_FAMILIES = {(384, 12, 1024): 'small', (384, 12, 1536): 'splus', (768, 12, 2048): 'base',
                  (1024, 24, 2730): 'large'}


def veca_backbone(sd: dict, ckpt: dict) -> Tuple[dict, str]:
    """The VECA config (``out_type='raw'``) the converted backbone loads into strictly."""
    official_cfg = ckpt.get('config') if isinstance(ckpt.get('config'), dict) else {}
    dims, depth = _width_depth(sd)
    half = sd['backbone.blocks.0.ffn.fc2.weight'].shape[1]
    arch = official_cfg.get('model_family') or _VECA_FAMILIES.get((dims, depth, half))
    if arch in veca.VECA.arch_zoo:
        settings = veca.VECA.arch_zoo[arch]
        if (settings['embed_dims'], settings['depth']) != (dims, depth):
            raise ValueError(f'the checkpoint config says model_family={arch!r}, but its '
                             f'weights have {dims} channels and {depth} blocks')
    elif 'num_heads' not in official_cfg:
        raise ValueError(f'weights of no official family ({dims} channels, {depth} blocks, '
                         f'SwiGLU width {half}) and no num_heads in the checkpoint config: the '
                         f'number of heads cannot be read from the weights')
    else:
        arch = dict(embed_dims=dims, depth=depth, num_heads=int(official_cfg['num_heads']),
                    mlp_ratio=float(official_cfg.get('mlp_ratio', half / dims)))
    chunks = sum(k.startswith('backbone.core_tokens.') for k in sd)
    chunk = sd['backbone.core_tokens.0'].shape[1]
    cfg = dict(type='mmeffattn.VECA', arch=arch, out_type='raw', max_cores=chunks * chunk,
               core_chunk=chunk, patch_norm='backbone.patch_embed.norm.weight' in sd)
    if 'backbone.output_proj.weight' in sd:
        cfg['out_proj_dims'] = sd['backbone.output_proj.weight'].shape[0]
    return cfg, str(arch)


class OfficialLayout(NamedTuple):
    """One family's published checkpoints: source, backbone class, detection, conversion to
    classifier keys (given the model's backbone, or None) and the backbone config they fit."""
    source: str
    family: type
    detect: Callable[[dict], bool]
    convert: Callable[[dict, Optional[nn.Module]], dict]
    backbone: Callable[[dict, dict], Tuple[dict, str]]


OFFICIAL_LAYOUTS = {
    'MLLA': OfficialLayout(
        'LeapLabTHU/MLLA', sema.SEMA, is_official_mlla,
        lambda ckpt, bb: mlla_to_classifier(ckpt, f'norm{bb.out_indices[-1]}' if bb else 'norm3'),
        mlla_backbone),
    'WeightFormer': OfficialLayout(
        'LeapLabTHU/WeightFormer', weightformer.WeightFormer,
        lambda ckpt: weightformer.is_official_state_dict(unwrap_state_dict(ckpt)),
        lambda ckpt, bb: weightformer.checkpoint_filter_weightformer_official(ckpt),
        weightformer_backbone),
    'VECA': OfficialLayout(  # distilled backbones: no classifier
        'alansong1322/VECA', veca.VECA,
        lambda ckpt: veca.is_official_state_dict(veca.unwrap_official(ckpt)),
        lambda ckpt, bb: veca.checkpoint_filter_veca_official(ckpt), veca_backbone),
}


def official_layout(ckpt: dict) -> Optional[str]:
    """The name of the official layout of ``ckpt`` (a key of :data:`OFFICIAL_LAYOUTS`), or None."""
    return next((name for name, layout in OFFICIAL_LAYOUTS.items() if layout.detect(ckpt)), None)


def model_checkpoint(model: nn.Module, checkpoint: str, map_location: str = 'cpu',
                     loaded: Optional[dict] = None) -> dict:
    """``checkpoint`` (a path or URL, or its content ``loaded``) as an mmengine checkpoint that
    holds exactly the keys and shapes of ``model`` (under any wrapper), else a one-line
    ``CheckpointError`` naming the keys."""
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    name = repr(checkpoint)
    checkpoint = loaded if loaded is not None else open_checkpoint(
        checkpoint, map_location, extra_safe_globals=OFFICIAL_STAND_INS)
    backbone = getattr(model, 'backbone', None)
    layout = next((n for n, official in OFFICIAL_LAYOUTS.items()  # the backbone's family's
                   if isinstance(backbone, official.family) and isinstance(checkpoint, dict)
                   and official.detect(checkpoint)), None)
    if layout:
        official = OFFICIAL_LAYOUTS[layout]
        name = f'{name} (official {layout}, converted)'
        checkpoint = dict(state_dict=official.convert(checkpoint, backbone),
                          meta=dict(converted_from=official.source))
    elif isinstance(checkpoint, dict) and isinstance(checkpoint.get('state_dict'), dict):
        checkpoint = dict(checkpoint, state_dict=strip_module_prefix(checkpoint['state_dict']))
    elif isinstance(checkpoint, dict):
        checkpoint = dict(state_dict=strip_module_prefix(unwrap_state_dict(checkpoint)), meta={})
    else:
        raise CheckpointError(f'checkpoint {name} holds a {type(checkpoint).__name__}, not a '
                              f'state dict')

    def hint(missing, unexpected, mismatched) -> str:
        own = list(model.state_dict())
        absent = [p for p in sorted({k.split('.')[0] for k in missing})
                  if all(k in missing for k in own if k.split('.')[0] == p)]
        return (f"It holds no weights for the model's {absent}: a backbone checkpoint (an "
                f'official VECA one, or a classifier\'s for a detector) starts a training, '
                f"through model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...), and "
                f'the trained model is tested. ' if absent else '') + \
            'Official layouts: docs/user_guides/weights.md'

    try:
        load_state_dict_strict(model, checkpoint['state_dict'], f'Checkpoint {name}', hint=hint,
                               describe=f'the model of the config ({type(model).__name__})',
                               dry_run=True)
    except RuntimeError as e:
        raise CheckpointError(str(e)) from None
    return checkpoint


def convert_official(layout: str, src: str, dst: str, unsafe: bool = False) -> dict:
    """Convert the official ``layout`` checkpoint ``src`` into ``dst`` (``backbone.*`` and
    ``head.fc.*`` keys checked against the backbone config in ``meta['backbone']``); returns the
    meta. ``unsafe`` reads ``src`` with ``weights_only=False`` (only for files you trust)."""
    official = OFFICIAL_LAYOUTS[layout]
    ckpt = load_checkpoint_file(src, extra_safe_globals=OFFICIAL_STAND_INS,
                                weights_only=not unsafe, hint='pass the file the official code '
                                'saved with torch.save, or its .safetensors file')
    if not official.detect(ckpt):
        raise CheckpointError(f'{src!r} is not an official {layout} checkpoint '
                              f'({official.source}): its keys start with '
                              f'{prefixes_of(unwrap_state_dict(ckpt))}')
    state_dict = official.convert(ckpt, None)
    backbone, arch = official.backbone(state_dict, ckpt)
    with torch.device('meta'):  # a strict check of the result, without building weights
        model = MODELS.build(backbone)
    load_state_dict_strict(model, keys_under(state_dict, 'backbone'), 'the converted checkpoint',
                           dry_run=True)
    meta = dict(source=osp.basename(src), converted_from=official.source, arch=arch,
                backbone=backbone)
    meta.update({k: ckpt[k] for k in ('epoch', 'step', 'global_step')
                 if isinstance(ckpt.get(k), int)})
    save_converted(state_dict, meta, dst)
    return meta


def save_converted(state_dict: dict, meta: dict, dst: str) -> None:
    """Write ``{'state_dict', 'meta'}`` to ``dst`` atomically; its folder must exist."""
    if not osp.isdir(osp.dirname(osp.abspath(dst))):
        raise FileNotFoundError(f'output folder {osp.dirname(osp.abspath(dst))!r} does not exist')
    atomic_save({'state_dict': state_dict, 'meta': meta}, dst)


def converter_main(layout: str, argv: Optional[Sequence[str]] = None) -> dict:
    """The command line ``SRC DST [--unsafe-load]`` of :func:`convert_official`."""
    parser = argparse.ArgumentParser(
        description=f'Convert an official {layout} checkpoint ({OFFICIAL_LAYOUTS[layout].source}) '
                    f'to an mmpretrain-style checkpoint (backbone.*, head.fc.*).')
    parser.add_argument('src', help='official checkpoint (.pth/.pt, or .safetensors)')
    parser.add_argument('dst', help='output checkpoint')
    parser.add_argument('--unsafe-load', action='store_true',
                        help='read SRC with torch.load(weights_only=False): only for files you '
                             'trust, when the safe loader refuses one')
    args = parser.parse_args(argv)
    install_checkpoint_io()  # as every tool of ours (no warning about mmengine's own loader)
    meta = convert_official(layout, args.src, args.dst, args.unsafe_load)
    print(f'{args.src} -> {args.dst}: arch {meta["arch"]}; its backbone.* keys load into '
          f'{meta["backbone"]}')
    return meta
