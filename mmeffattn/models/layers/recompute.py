"""Gradient-checkpoint recomputation, made visible to layers that keep running statistics.

``torch.utils.checkpoint`` runs a block's forward twice in training: once without keeping
activations, again in backward. Layers that update running estimates from batch statistics
(LaplacianFormer's :class:`DiagonalWhitening` and
:class:`~mmeffattn.models.layers.kernel_whitening.KernelWhitening`) would count the batch twice;
during the second pass :func:`is_recomputing` is True, and they normalise with the batch statistics
as in the first pass without updating their estimates again.
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
