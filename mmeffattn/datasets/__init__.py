"""Datasets: a deterministic synthetic COCO-format shapes dataset for the demo.

Importing this package is cheap (numpy only; no mmdet, no torch), and the submodule itself is
loaded on first use, so ``python -m mmeffattn.datasets.synthetic_shapes`` runs it cleanly.
"""
import importlib

__all__ = [
    'DEFAULT_CLASSES', 'DEFAULT_METAINFO', 'SHAPE_KINDS', 'generate_shapes_coco',
    'load_shapes_meta', 'make_contact_sheet', 'shapes_metainfo',
]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module('.synthetic_shapes', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(list(globals()) + __all__)
