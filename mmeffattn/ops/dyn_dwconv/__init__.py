"""Deprecated: the op's folder is now ``mmeffattn.ops.dynamic_dwconv``; this name (and its
submodules) are the same modules, with a DeprecationWarning."""
from .._common import alias_package

alias_package(__name__, 'mmeffattn.ops.dynamic_dwconv')
