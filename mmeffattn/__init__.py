"""mmeffattn: efficient vision attention backbones for the OpenMMLab ecosystem.

``import mmeffattn`` registers every model in :mod:`mmeffattn.registry`. It needs neither a GPU
nor Triton: without them the attention ops run their pure PyTorch references.
"""
from .version import __version__
from . import ops  # noqa: F401  (ops first: models call them)
from . import models  # noqa: F401
from . import engine  # noqa: F401

# mmengine's Runner saves checkpoints atomically and loads them through a safe loader whose
# allow-list is active only during each load (no process-wide add_safe_globals).
engine.install_checkpoint_io()
# Configs elsewhere may inherit ours as 'mmeffattn::<path>' (shipped in mmeffattn/.mim).
engine.compat.register_config_package()

__all__ = ['__version__']
