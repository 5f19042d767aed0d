"""The ops as PyTorch custom operators (``torch.library``, namespace ``mmeffattn``): each op's
``library.py`` declares ``mmeffattn::<op>`` and ``mmeffattn::<op>_backward`` with :func:`define`
and registers the forward's autograd, the op's only Triton path. With compiled Triton they are
``triton_op``s whose launches the compiler sees (``wrap_triton``); under the interpreter opaque
``custom_op``s. The fake implementation is the launcher code with its launches off. Forward
operators return the output first, then what their backward needs (an absent one is an empty
tensor); backward operators have no autograd. Details: docs/adding_an_op.md.
"""
from typing import Callable, Optional

import torch

from ._backend import TRITON_INTERPRET
from ._launch import record_launches

NAMESPACE = 'mmeffattn'


def _fake(impl: Callable) -> Callable:
    """``impl`` with its kernel launches switched off (inside ``record_launches`` the launchers
    only allocate their outputs): the fake implementation."""
    def fake(*args, **kwargs):
        with record_launches():
            return impl(*args, **kwargs)
    fake.__name__ = f'{impl.__name__}_fake'
    return fake


def define(name: str, schema: str, impl: Callable):
    """Register ``impl`` (one op's forward or backward launchers) as ``mmeffattn::<name>``
    with ``schema`` and its fake implementation; returns the ``CustomOpDef``. ``impl`` launches
    through :func:`._launch.launch` and returns new tensors (outputs may not alias inputs).
    """
    qualname = f'{NAMESPACE}::{name}'
    if TRITON_INTERPRET:
        op = torch.library.custom_op(qualname, impl, mutates_args=(), schema=schema)
        op.register_fake(_fake(impl))
    else:
        # registers impl for every device and, run on fake tensors, as the fake implementation
        # (under fake tensors ``wrap_triton`` launches nothing)
        op = torch.library.triton_op(qualname, impl, mutates_args=(), schema=schema)
    return op


def empty_like_none(ref: torch.Tensor, t: Optional[torch.Tensor]) -> torch.Tensor:
    """``t``, or an empty tensor on ``ref``'s device for an absent (None) output."""
    return ref.new_empty(0) if t is None else t


def none_if_empty(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The inverse of :func:`empty_like_none`."""
    return None if t.numel() == 0 else t

