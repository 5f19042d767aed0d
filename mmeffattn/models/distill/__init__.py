"""Distillation wrappers: a frozen teacher's features trained into one of our backbones."""
from .veca_distiller import (VECADistiller, global_cosine_loss, load_teacher_checkpoint,
                             patch_losses, split_teacher_tokens)

__all__ = ['VECADistiller', 'global_cosine_loss', 'load_teacher_checkpoint', 'patch_losses',
           'split_teacher_tokens']
