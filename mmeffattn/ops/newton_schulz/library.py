"""Custom operators ``mmeffattn::newton_schulz_pinv`` and its backward (``_library.py``)."""
from typing import Tuple

import torch

from .._library import define, empty_like_none, none_if_empty
from .function import (MAX_ONCHIP_M, newton_schulz_bwd, newton_schulz_bwd_torch,
                       newton_schulz_fwd, newton_schulz_fwd_torch)


def _forward(a: torch.Tensor, iters: int, eps: float, store_iterates: bool
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, iterates)``: the iterates the backward reads, empty unless ``store_iterates``."""
    fwd = newton_schulz_fwd if a.shape[-1] <= MAX_ONCHIP_M else newton_schulz_fwd_torch
    out, ws = fwd(a, iters, eps, store_iterates and iters > 0)
    return out, empty_like_none(out, ws)


def _backward(grad: torch.Tensor, a: torch.Tensor, iterates: torch.Tensor, iters: int,
              eps: float) -> torch.Tensor:
    ws = none_if_empty(iterates)
    if iters > 0 and ws is None:
        raise RuntimeError('mmeffattn::newton_schulz_pinv_backward: the forward did not store '
                           'its iterates; call the forward with store_iterates=True when a '
                           'gradient is needed')
    bwd = newton_schulz_bwd if a.shape[-1] <= MAX_ONCHIP_M else newton_schulz_bwd_torch
    return bwd(grad, a, ws, iters, eps)


newton_schulz_pinv_op = define(
    'newton_schulz_pinv', '(Tensor a, int iters, float eps, bool store_iterates) '
    '-> (Tensor, Tensor)', _forward)
newton_schulz_pinv_backward_op = define(
    'newton_schulz_pinv_backward', '(Tensor grad, Tensor a, Tensor iterates, int iters, '
    'float eps) -> Tensor', _backward)


def _setup_context(ctx, inputs, output) -> None:
    a, ctx.iters, ctx.eps, _ = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(a, output[1])


def _autograd_backward(ctx, grad: torch.Tensor, _grad_iterates):
    a, iterates = ctx.saved_tensors
    return newton_schulz_pinv_backward_op(grad, a, iterates, ctx.iters, ctx.eps), None, None, None


newton_schulz_pinv_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def newton_schulz_pinv_triton(a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.newton_schulz_pinv`` (batched matmuls beyond
    ``MAX_ONCHIP_M``); iterates are stored only when a gradient can be needed."""
    store = torch.is_grad_enabled() and a.requires_grad
    return newton_schulz_pinv_op(a, int(iters), float(eps), store)[0]
