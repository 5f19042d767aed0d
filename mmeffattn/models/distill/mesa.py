"""MESA (MLLA's recipe): self-distillation from the model's own EMA, ``mesa * CE(logits,
softmax(ema_logits))``. ``MESAClassifier`` is mmpretrain's ``ImageClassifier`` plus this
``loss_mesa`` while :class:`~mmeffattn.engine.MESAHook` hands it the EMA model.
"""
import functools
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.registry import MODELS

__all__ = ['MESAMixin', 'build_mesa_classifier', 'soft_target_cross_entropy']


def soft_target_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean_b sum_c -target[b, c] log_softmax(logits)[b, c]`` in fp32 (timm's
    ``SoftTargetCrossEntropy``); ``logits``, ``target``: ``[B, classes]``."""
    return torch.sum(-target.float() * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


class MESAMixin:
    """The MESA term for an mmpretrain classifier (a class with ``extract_feat`` and a
    ``ClsHead``-like ``head``)."""

    def set_mesa_teacher(self, teacher: Optional[nn.Module], weight: float = 0.) -> None:
        """Turn the term on with the EMA model ``teacher`` and its ``weight``, or off (None); the
        teacher is kept outside the module tree (no keys, parameters or mode changes)."""
        self.__dict__['_mesa'] = (teacher, float(weight)) if teacher is not None else None

    def loss(self, inputs: torch.Tensor, data_samples: list) -> dict:
        """The head's losses, plus ``loss_mesa`` while a teacher is set."""
        mesa = self.__dict__.get('_mesa')
        feats = self.extract_feat(inputs)
        if mesa is None:
            return self.head.loss(feats, data_samples)
        teacher, weight = mesa
        logits = self.head(feats)
        losses = self.head._get_loss(logits, data_samples)
        with torch.no_grad():
            target = teacher(inputs, mode='tensor').float().softmax(dim=-1)
        losses['loss_mesa'] = weight * soft_target_cross_entropy(logits, target)
        return losses


@functools.lru_cache(maxsize=None)
def _mesa_classifier_class() -> type:
    # mmpretrain is imported on first use only: mmdet/mmseg runs never pay for it
    from mmpretrain.models import ImageClassifier

    cls = type('MESAClassifier', (MESAMixin, ImageClassifier), {
        '__doc__': "mmpretrain's ImageClassifier with MLLA's MESA term (see "
                   ':mod:`mmeffattn.models.distill.mesa`).',
        '__module__': __name__})
    globals()['MESAClassifier'] = cls  # picklable by name once built
    return cls


@MODELS.register_module(name='MESAClassifier')
def build_mesa_classifier(**kwargs) -> nn.Module:
    """``type='mmeffattn.MESAClassifier'``: mmpretrain's ``ImageClassifier`` arguments."""
    return _mesa_classifier_class()(**kwargs)
