"""mmeffattn: efficient vision attention backbones for the OpenMMLab ecosystem.

``import mmeffattn`` registers the models, hooks and optimizer wrappers in
:mod:`mmeffattn.registry` and changes nothing else: mmengine and torch stay as they were. The
checkpoint patches our tools use are the opt-in :mod:`mmeffattn.engine.patch_mmengine`.

The attention ops (:mod:`mmeffattn.ops`) need only torch (and Triton for their kernels): without
mmengine installed, only they are imported."""
import importlib.util

from .version import __version__
from . import ops  # noqa: F401  (ops first: models call them)

if importlib.util.find_spec('mmengine') is not None:
    from . import models  # noqa: F401
    from . import engine  # noqa: F401

__all__ = ['__version__']
