"""Old public names kept working, with a ``DeprecationWarning`` that names the new one."""
import functools
import warnings
from typing import Callable


def deprecated_alias(new: Callable, old_name: str) -> Callable:
    """A function called ``old_name`` that warns and calls ``new``."""

    @functools.wraps(new)
    def alias(*args, **kwargs):
        warnings.warn(f'{old_name} is deprecated; use {new.__name__} (same arguments)',
                      DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name
    alias.__doc__ = f'Deprecated alias of :func:`{new.__name__}`.'
    return alias
