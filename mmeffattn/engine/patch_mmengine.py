"""Opt-in import (idempotent): patches mmengine's checkpoint I/O and enables
``_base_ = 'mmeffattn::<path>'``. Our tools import it; in a stock config::

    custom_imports = dict(imports=['mmeffattn', 'mmeffattn.engine.patch_mmengine'],
                          allow_failed_imports=False)
"""
from .checkpoint_io import install_checkpoint_io
from .compat import register_config_package

install_checkpoint_io()
register_config_package()
