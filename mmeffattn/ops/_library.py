"""The ops as PyTorch custom operators (``torch.library``, namespace ``mmeffattn``).

Each op's ``<op>/library.py`` declares two operators with :func:`define`: the forward
``mmeffattn::<op>`` and ``mmeffattn::<op>_backward``, and registers the forward's autograd
(``register_autograd`` with a ``setup_context``) so that the backward is the second operator.
The public function calls the forward operator when it dispatches to Triton; the PyTorch
reference is called directly, as plain PyTorch, so the CPU path and ONNX export see ordinary
aten ops.

What the registration gives:

* ``torch.export`` captures a Triton call as one ``mmeffattn.<op>`` node, and ``torch.compile``
  traces through it without a graph break: with compiled Triton the operator is a
  ``torch.library.triton_op`` whose launches go through ``wrap_triton`` (:mod:`._launch`), so
  the compiler sees the kernels themselves.
* The fake (meta) implementation is the launcher code run on fake tensors with the launches
  switched off: the outputs' shapes, dtypes and strides come from the very code that allocates
  them, so they cannot drift apart.
* Under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) ``wrap_triton`` cannot trace
  an interpreted kernel (torch returns the kernel unwrapped, and it would read fake tensors'
  data), so there the operators are opaque ``torch.library.custom_op``s with the fake above:
  eager calls, ``torch.compile`` (one opaque node, no graph break), ``torch.export`` and
  ``torch.library.opcheck`` all work, the compiler just does not see inside the kernels.

Forward operators return the output first, then the tensors their backward needs (e.g. SEMA's
log-sum-exp); an absent one is an empty tensor (schemas have no optional returns). These extra
outputs are marked non-differentiable. The backward operators have no autograd (first-order
gradients only, as the kernels).
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
    """Register ``impl`` (the launchers of one op, direction forward or backward) as
    ``mmeffattn::<name>`` with ``schema`` (e.g. ``'(Tensor x, float lam) -> Tensor'``) and its
    fake implementation; returns the ``CustomOpDef`` (call it like the function, or through
    ``torch.ops.mmeffattn.<name>``).

    ``impl`` must allocate its outputs with torch (``torch.empty`` and friends), launch every
    kernel through :func:`mmeffattn.ops._launch.launch`, and return new tensors (never an input
    or a view of one: custom operators' outputs may not alias their inputs).
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

