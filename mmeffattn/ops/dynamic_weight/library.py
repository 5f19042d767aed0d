"""Custom operators ``mmeffattn::dynamic_weight`` and its backward (``_library.py``)."""
from typing import Optional, Sequence, Tuple

import torch

from .._launch import unit_last_stride
from .._library import define, empty_like_none
from .function import DEFAULT_INPUT_PRECISION, dynamic_weight_bwd, dynamic_weight_fwd


def _forward(u: torch.Tensor, v: torch.Tensor, weight: Optional[torch.Tensor], s: float,
             input_precision: str) -> torch.Tensor:
    u, v = unit_last_stride(u), unit_last_stride(v)
    if weight is not None:
        weight = unit_last_stride(weight)
    return dynamic_weight_fwd(u, v, s, weight, input_precision)


def _backward(grad: torch.Tensor, u: torch.Tensor, v: torch.Tensor, s: float,
              input_precision: str, needs: Sequence[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    u, v = unit_last_stride(u), unit_last_stride(v)
    du, dv = dynamic_weight_bwd(grad, u, v, s, (needs[0], needs[1]), input_precision)
    return empty_like_none(u, du), empty_like_none(u, dv)


dynamic_weight_op = define(
    'dynamic_weight', '(Tensor u, Tensor v, Tensor? weight, float s, str input_precision) '
    '-> Tensor', _forward)
dynamic_weight_backward_op = define(
    'dynamic_weight_backward', '(Tensor grad, Tensor u, Tensor v, float s, str input_precision, '
    'bool[2] needs) -> (Tensor, Tensor)', _backward)


def _setup_context(ctx, inputs, output) -> None:
    u, v, weight, ctx.s, ctx.input_precision = inputs
    ctx.save_for_backward(u, v)
    ctx.weight_dtype = None if weight is None else weight.dtype


def _autograd_backward(ctx, grad: torch.Tensor):
    needs = ctx.needs_input_grad
    du = dv = dweight = None
    if needs[0] or needs[1]:
        du, dv = dynamic_weight_backward_op(grad, *ctx.saved_tensors, ctx.s, ctx.input_precision,
                                            [needs[0], needs[1]])
    if needs[2]:
        dweight = grad.sum(dim=0, dtype=torch.float32).to(ctx.weight_dtype)
    return du if needs[0] else None, dv if needs[1] else None, dweight, None, None


dynamic_weight_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def dynamic_weight_triton(u: torch.Tensor, v: torch.Tensor, n_tokens: float,
                          scale: Optional[float] = None, weight: Optional[torch.Tensor] = None,
                          input_precision: str = DEFAULT_INPUT_PRECISION) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.dynamic_weight``."""
    scale = u.shape[-1] ** -0.5 if scale is None else float(scale)
    return dynamic_weight_op(u, v, weight, scale / float(n_tokens), input_precision)
