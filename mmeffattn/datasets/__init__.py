"""Datasets: the synthetic shapes (loaded on first use, so ``python -m
mmeffattn.datasets.synthetic_shapes`` runs cleanly) and ``mmeffattn.UnlabeledImageFolder``."""
import importlib

from .image_folder import UnlabeledImageFolder  # noqa: F401  (registers the dataset)

__all__ = ['DEFAULT_CLASSES', 'DEFAULT_METAINFO', 'SHAPE_KINDS', 'generate_shapes_coco',
           'generate_shapes_ade20k', 'generate_shapes_imagenet', 'load_shapes_meta',
           'make_contact_sheet', 'shapes_metainfo', 'UnlabeledImageFolder']


def __getattr__(name):  # (called only for names not in the module: the lazy ones)
    if name in __all__:
        return getattr(importlib.import_module('.synthetic_shapes', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(list(globals()) + __all__)
