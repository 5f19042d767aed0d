"""The opt-in import that makes mmengine's Runner save and load checkpoints the mmeffattn way.

``import mmeffattn`` only registers modules. Importing this module (once per process,
idempotent) also patches mmengine:

* atomic checkpoint saves, the scoped safe loader for ``resume``/``load_from`` of mmengine
  checkpoints under torch's weights-only loader, and URL downloads cached by the whole URL
  (:func:`~mmeffattn.engine.checkpoint_io.install_checkpoint_io`);
* ``_base_ = 'mmeffattn::<path>'`` in configs parsed afterwards
  (:func:`~mmeffattn.engine.compat.register_config_package`).

Our tools (tools/train.py, tools/test.py) do this themselves. In a stock mmdet/mmseg/mmpretrain
config, one line switches it on::

    custom_imports = dict(imports=['mmeffattn', 'mmeffattn.engine.patch_mmengine'],
                          allow_failed_imports=False)
"""
from .checkpoint_io import install_checkpoint_io
from .compat import register_config_package

install_checkpoint_io()
register_config_package()
