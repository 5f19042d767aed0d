"""Opt-in import: patches mmengine's checkpoint I/O and enables ``_base_ = 'mmeffattn::<path>'``.

Idempotent (:func:`~mmeffattn.engine.checkpoint_io.install_checkpoint_io`,
:func:`~mmeffattn.engine.compat.register_config_package`). Our tools import it; in a stock config::

    custom_imports = dict(imports=['mmeffattn', 'mmeffattn.engine.patch_mmengine'],
                          allow_failed_imports=False)
"""
from .checkpoint_io import install_checkpoint_io
from .compat import register_config_package

install_checkpoint_io()
register_config_package()
