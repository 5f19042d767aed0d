"""Distillation: a frozen teacher's features trained into one of our backbones (VECA), and
MLLA's MESA self-distillation from the model's own EMA."""
from .mesa import MESAMixin, build_mesa_classifier, soft_target_cross_entropy
from .veca_distiller import (VECADistiller, global_cosine_loss, load_teacher_checkpoint,
                             patch_losses, split_teacher_tokens)

__all__ = ['MESAMixin', 'build_mesa_classifier', 'soft_target_cross_entropy', 'VECADistiller',
           'global_cosine_loss', 'load_teacher_checkpoint', 'patch_losses',
           'split_teacher_tokens']
