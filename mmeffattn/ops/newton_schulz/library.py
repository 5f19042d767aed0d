"""Custom operators ``mmeffattn::newton_schulz_pinv`` and its backward (``_library.py``)."""
from typing import Tuple

import torch

from .._common import compute_dtype
from .._library import define, empty_like_none, none_if_empty
from .function import newton_schulz_bwd, newton_schulz_fwd


def _forward(a: torch.Tensor, iters: int, eps: float, store_iterates: bool, implicit: bool
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, iterates)``: the iterates the unrolled backward reads, empty unless
    ``store_iterates`` (``implicit``: the backward reads only ``out``)."""
    out, ws = newton_schulz_fwd(a, iters, eps, store_iterates and iters > 0 and not implicit)
    return out, empty_like_none(out, ws)


def _backward(grad: torch.Tensor, a: torch.Tensor, iterates: torch.Tensor, iters: int,
              eps: float) -> torch.Tensor:
    ws = none_if_empty(iterates)
    if iters > 0 and ws is None:
        raise RuntimeError('mmeffattn::newton_schulz_pinv_backward: the forward did not store '
                           'its iterates; call the forward with store_iterates=True when a '
                           'gradient is needed')
    return newton_schulz_bwd(grad, a, ws, iters, eps)


newton_schulz_pinv_op = define(
    'newton_schulz_pinv', '(Tensor a, int iters, float eps, bool store_iterates, '
    'bool implicit) -> (Tensor, Tensor)', _forward)
newton_schulz_pinv_backward_op = define(
    'newton_schulz_pinv_backward', '(Tensor grad, Tensor a, Tensor iterates, int iters, '
    'float eps) -> Tensor', _backward)


def _setup_context(ctx, inputs, output) -> None:
    a, ctx.iters, ctx.eps, _, ctx.implicit = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*((output[0], ) if ctx.implicit else (a, output[1])))


def _autograd_backward(ctx, grad: torch.Tensor, _grad_iterates):
    if ctx.implicit:  # the exact inverse's gradient at the result V: -V^T G V^T
        vt = ctx.saved_tensors[0].transpose(-1, -2)
        ct = compute_dtype(vt.dtype)
        da = -(vt.to(ct) @ grad.to(ct) @ vt.to(ct)).to(vt.dtype)
    else:
        a, iterates = ctx.saved_tensors
        da = newton_schulz_pinv_backward_op(grad, a, iterates, ctx.iters, ctx.eps)
    return da, None, None, None, None


newton_schulz_pinv_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def newton_schulz_pinv_triton(a: torch.Tensor, iters: int, eps: float,
                              implicit: bool = False) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.newton_schulz_pinv``; iterates are stored only
    when an unrolled gradient can be needed."""
    store = torch.is_grad_enabled() and a.requires_grad
    return newton_schulz_pinv_op(a, int(iters), float(eps), store, bool(implicit))[0]
