"""Gradient-checkpoint recomputation, made visible to layers that keep running statistics.

``torch.utils.checkpoint`` runs a block's forward twice; during the second pass
:func:`is_recomputing` is True, so whitening layers reuse the batch statistics without updating
their running estimates again.
"""
import contextlib
import threading
from typing import Iterator, Tuple

__all__ = ['checkpoint_contexts', 'is_recomputing', 'recomputing']

_STATE = threading.local()  # per thread: the autograd engine recomputes on its own threads


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    """Marks a gradient-checkpoint recomputation (see the module docstring)."""
    saved = is_recomputing()
    _STATE.recomputing = True
    try:
        yield
    finally:
        _STATE.recomputing = saved


def is_recomputing() -> bool:
    """Whether this thread runs a gradient-checkpoint recomputation."""
    return getattr(_STATE, 'recomputing', False)


def checkpoint_contexts() -> Tuple[contextlib.AbstractContextManager,
                                   contextlib.AbstractContextManager]:
    """``context_fn`` of ``torch.utils.checkpoint``: nothing for the forward, :func:`recomputing`
    for the recomputation in backward."""
    return contextlib.nullcontext(), recomputing()
