"""Strict, helpful loading of backbone checkpoints, shared by every family.

mmengine's ``PretrainedInit`` loads non-strictly and only logs what did not match, so a wrong
prefix or arch silently trains from random weights. Here a missing backbone key or a shape
mismatch raises an error that names the keys and suggests the fix.
"""
import re
from typing import Dict, List, Optional

import torch
from mmengine.logging import MMLogger


def unwrap_state_dict(ckpt: dict) -> Dict[str, torch.Tensor]:
    """The state dict inside an mmengine (``state_dict``) or official (``model``) checkpoint."""
    for key in ('state_dict', 'model'):
        if isinstance(ckpt, dict) and key in ckpt and isinstance(ckpt[key], dict):
            return ckpt[key]
    return ckpt


def clip_keys(keys: List[str], n: int = 12) -> str:
    """``keys`` as a list string, shortened to ``n`` entries."""
    return str(keys[:n])[:-1] + (f', ... {len(keys) - n} more]' if len(keys) > n else ']')


def guess_prefix(probe: Optional[str], ckpt_keys: List[str]) -> Optional[str]:
    """The prefix under which a checkpoint holds the key ``probe`` (e.g. ``'backbone.'``)."""
    if probe is None or probe in ckpt_keys:
        return None
    for k in ckpt_keys:
        if k.endswith('.' + probe):
            return k[:-len(probe)]
    return None


class StrictPretrainedMixin:
    """``init_weights`` for an mmengine ``BaseModule`` backbone with a strict ``Pretrained`` load.

    ``init_cfg=dict(type='Pretrained', checkpoint=PATH, prefix=None)`` reads the checkpoint with
    mmengine's ``CheckpointLoader``, unwraps it, keeps the keys under ``prefix`` (stripped), maps
    them with :meth:`checkpoint_filter` and loads them. ``checkpoint=None`` (our configs' default)
    keeps the initialization. Other ``init_cfg`` entries run the mmengine way.

    Subclasses set:
        optional_keys: regex of own keys a checkpoint may lack (e.g. output norms); logged.
        prefix_probe: an own key used to detect the prefix of a whole-model checkpoint.
        official_name: how error messages name a bare checkpoint of the family.
    and may override :meth:`checkpoint_filter` and :meth:`describe`.
    """

    optional_keys: str = r'$^'
    prefix_probe: Optional[str] = None
    official_name: str = 'backbone/classification'

    def checkpoint_filter(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return state_dict

    def describe(self) -> str:
        return f'{self.__class__.__name__}(arch={getattr(self, "arch_settings", "?")})'

    def init_weights(self) -> None:
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        cfgs = [c for c in cfgs if c is not None]
        pretrained = [c for c in cfgs if c.get('type') == 'Pretrained']
        if len(pretrained) > 1:
            raise ValueError(f'{self.__class__.__name__} got {len(pretrained)} Pretrained '
                             f'init_cfg entries; give one')
        if not pretrained:
            super().init_weights()
            return
        others = [c for c in cfgs if c.get('type') != 'Pretrained']
        saved, self.init_cfg = self.init_cfg, (others or None)
        try:
            super().init_weights()
        finally:
            self.init_cfg = saved
        if pretrained[0].get('checkpoint') is None:
            # configs name the entry with checkpoint=None so that one --cfg-options key switches
            # ImageNet weights on; until then the backbone trains from scratch
            MMLogger.get_current_instance().info(
                f'{self.__class__.__name__}: Pretrained init_cfg has checkpoint=None; training '
                f'from scratch (set model.backbone.init_cfg.checkpoint=PATH to load weights)')
            return
        self.load_pretrained(pretrained[0]['checkpoint'], prefix=pretrained[0].get('prefix'),
                             map_location=pretrained[0].get('map_location', 'cpu'))

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu') -> None:
        """Load a checkpoint file strictly (see the class docstring)."""
        from mmengine.runner.checkpoint import CheckpointLoader

        if not checkpoint:
            raise ValueError("init_cfg=dict(type='Pretrained') needs a 'checkpoint'")
        logger = MMLogger.get_current_instance()
        ckpt = CheckpointLoader.load_checkpoint(checkpoint, map_location=map_location,
                                                logger=logger)
        state_dict = unwrap_state_dict(ckpt)
        if prefix:
            prefix = prefix if prefix.endswith('.') else prefix + '.'
            sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            if not sub:
                heads = sorted({k.split('.', 1)[0] + '.' for k in state_dict})
                raise RuntimeError(
                    f'No key of checkpoint {checkpoint!r} starts with prefix {prefix!r}; its keys '
                    f'start with {heads[:20]}. Set init_cfg prefix to one of them, or to None for '
                    f'a bare {self.official_name} checkpoint.')
            state_dict = sub
        state_dict = self.checkpoint_filter(state_dict)
        self._load_state_dict_strict(state_dict, checkpoint, prefix, logger)
        logger.info(f'{self.__class__.__name__}: loaded {len(state_dict)} tensors from '
                    f'{checkpoint!r}' + (f' (prefix {prefix!r})' if prefix else ''))

    def _load_state_dict_strict(self, state_dict: Dict[str, torch.Tensor], checkpoint: str,
                                prefix: Optional[str], logger: MMLogger) -> None:
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        optional = [k for k in missing if re.match(self.optional_keys, k)]
        missing = [k for k in missing if k not in optional]
        mismatched = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}'
                      for k, v in own.items() if k in state_dict and state_dict[k].shape != v.shape]
        if missing or mismatched:
            found = guess_prefix(self.prefix_probe, list(state_dict))
            if found:
                hint = (f'The backbone weights seem to lie under {found!r}: set '
                        f"init_cfg=dict(type='Pretrained', checkpoint=..., prefix={found!r})")
            elif not prefix:
                hint = ('If the checkpoint holds a whole classifier/detector/segmentor, set '
                        "init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')")
            else:
                hint = f'Check that prefix {prefix!r} selects the backbone'
            raise RuntimeError(
                f'Checkpoint {checkpoint!r} does not match {self.describe()}: '
                f'{len(missing)} missing keys {clip_keys(missing)}; '
                f'{len(mismatched)} shape mismatches {clip_keys(mismatched)}; '
                f'{len(unexpected)} unexpected keys {clip_keys(unexpected)}. {hint}, and that '
                f'the model options match the checkpoint.')
        if unexpected:
            logger.warning(f'{self.__class__.__name__}: ignoring {len(unexpected)} unexpected '
                           f'checkpoint keys {clip_keys(unexpected)}')
        if optional:
            logger.info(f'{self.__class__.__name__}: parts not in the checkpoint keep their '
                        f'init: {clip_keys(optional)}')
        self.load_state_dict(state_dict, strict=False)
