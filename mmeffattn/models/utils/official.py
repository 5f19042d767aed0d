"""Official checkpoint layouts recognised at load time.

``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` takes the authors' own checkpoints (MLLA,
WeightFormer, VECA) as they are published: :class:`~.pretrained.StrictPretrainedMixin` asks
:func:`convert_official` whether the state dict is in an official layout for the backbone being
loaded and, if so, converts it with the family's converter (the same function the offline
converters in ``tools/model_converters`` use: one implementation) and logs that it did.

The converters live beside their models (timm's ``checkpoint_filter_fn`` convention) and are
imported lazily here, since the model files import this package.
"""
import importlib
import re
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

from .pretrained import strip_module_prefix, unwrap_state_dict

StateDict = Dict[str, torch.Tensor]

__all__ = ['OfficialLayout', 'OFFICIAL_LAYOUTS', 'official_layout_of', 'convert_official']


class OfficialLayout(NamedTuple):
    """How to recognise and convert one family's official checkpoints.

    Attributes:
        name: how logs name the layout.
        source: where the official code lives.
        families: class names (``__mro__``) of the backbones it loads into.
        detect: ``'module:function'``, ``state_dict -> bool``: the layout is official.
        convert: ``'module:function'``, ``state_dict -> state_dict``: the converter.
        backbone_prefix: prefix of the backbone keys in the converter's output ('' for none).
    """
    name: str
    source: str
    families: Tuple[str, ...]
    detect: str
    convert: str
    backbone_prefix: str = ''


def _resolve(path: str) -> Callable:
    module, name = path.split(':')
    return getattr(importlib.import_module(module), name)


def is_official_mlla(state_dict: StateDict) -> bool:
    """Whether a state dict is an official MLLA/MILA classification checkpoint: the MLLA key
    names with the classifier (``head.*``), the classification norm (``norm.*``) or the
    fixed-size RoPE tables (``*.attn.rope.rotations``) that the backbone does not have."""
    keys = list(strip_module_prefix(unwrap_state_dict(state_dict)))
    mlla = any(re.match(r'layers\.\d+\.blocks\.\d+\.', k) for k in keys) and \
        any(k.startswith('patch_embed.conv1.') for k in keys)
    return mlla and any(k.startswith(('head.', 'norm.')) or k.endswith('attn.rope.rotations')
                        for k in keys)


_SEMA = 'mmeffattn.models.backbones.sema'
_WF = 'mmeffattn.models.backbones.weightformer'
_VECA = 'mmeffattn.models.backbones.veca'

#: the official layouts, checked in this order
OFFICIAL_LAYOUTS = (
    OfficialLayout('MLLA', 'github.com/LeapLabTHU/MLLA', ('SEMA', 'MILA'),
                   detect=f'{__name__}:is_official_mlla',
                   convert=f'{_SEMA}:checkpoint_filter_mlla'),
    OfficialLayout('WeightFormer', 'github.com/LeapLabTHU/WeightFormer (model/wfm.py)',
                   ('WeightFormer', ), detect=f'{_WF}:is_official_state_dict',
                   convert=f'{_WF}:checkpoint_filter_weightformer_official',
                   backbone_prefix='backbone.'),
    OfficialLayout('VECA', 'github.com/alansong1322/VECA (veca/model.py)', ('VECA', ),
                   detect=f'{_VECA}:is_official_state_dict',
                   convert=f'{_VECA}:checkpoint_filter_veca_official',
                   backbone_prefix='backbone.'),
)


def official_layout_of(model: type, state_dict: dict) -> Optional[OfficialLayout]:
    """The official layout of ``state_dict`` for a backbone class ``model``, or None."""
    names = {c.__name__ for c in model.__mro__}
    for layout in OFFICIAL_LAYOUTS:
        if names.intersection(layout.families):
            sd = state_dict.get('student', state_dict)  # VECA training checkpoints
            if isinstance(sd, dict) and _resolve(layout.detect)(unwrap_state_dict(sd)):
                return layout
    return None


def convert_official(model: type, state_dict: dict
                     ) -> Tuple[dict, Optional[OfficialLayout]]:
    """``(backbone state dict, layout)`` if ``state_dict`` is an official checkpoint of the
    family of ``model`` (converted by the family's converter, backbone keys only), else
    ``(state_dict, None)`` unchanged."""
    layout = official_layout_of(model, state_dict)
    if layout is None:
        return state_dict, None
    out = _resolve(layout.convert)(state_dict)
    if layout.backbone_prefix:
        p = layout.backbone_prefix
        out = {k[len(p):]: v for k, v in out.items() if k.startswith(p)}
    return out, layout
