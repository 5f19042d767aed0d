"""Datasets: a deterministic synthetic COCO-format shapes dataset for the demo, and an unlabeled
image folder (``mmeffattn.UnlabeledImageFolder``) for distillation.

The shapes submodule is loaded on first use (numpy only), so
``python -m mmeffattn.datasets.synthetic_shapes`` runs it cleanly. The image folder is imported
here because the dataset registry imports this package to find registered types.
"""
import importlib

from .image_folder import UnlabeledImageFolder  # noqa: F401  (registers the dataset)

__all__ = [
    'DEFAULT_CLASSES', 'DEFAULT_METAINFO', 'SHAPE_KINDS', 'generate_shapes_coco',
    'generate_shapes_ade20k', 'generate_shapes_imagenet', 'load_shapes_meta',
    'make_contact_sheet', 'shapes_metainfo',
]
_LAZY = list(__all__)
__all__ += ['UnlabeledImageFolder']


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module('.synthetic_shapes', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(list(globals()) + __all__)
