"""SEMA attention as the custom operators ``mmeffattn::sema_attention`` (+ ``_backward``); see
:mod:`mmeffattn.ops._library`. Importing this module needs Triton (``op.py`` guards it)."""
from typing import List, Optional, Sequence, Tuple

import torch

from .._launch import unit_last_stride
from .._library import define, empty_like_none, none_if_empty
from .function import DEFAULT_INPUT_PRECISION, sema_bwd, sema_fwd, window_geometry


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
             window_size: int, scale: float, with_mean: bool, input_precision: str,
             out_layout: str = 'bhnd') -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, mean)``: out in ``out_layout``; lse (several blocks per window) and mean
    (``with_mean``) are what the backward reads, empty when absent."""
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    o, lse, mean = sema_fwd(q, k, v, window_geometry(tuple(hw), window_size), scale, with_mean,
                            input_precision, out_layout)
    return o, empty_like_none(o, lse), empty_like_none(o, mean)


def _backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, mean: torch.Tensor, hw: Sequence[int],
              window_size: int, scale: float, with_mean: bool, input_precision: str,
              out_layout: str = 'bhnd') -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    return sema_bwd(grad, q, k, v, out, none_if_empty(lse), none_if_empty(mean),
                    window_geometry(tuple(hw), window_size), scale, with_mean, input_precision,
                    out_layout)


_ARGS = ('SymInt[2] hw, int window_size, float scale, bool with_mean, str input_precision, '
         'str out_layout="bhnd"')
sema_attention_op = define(
    'sema_attention', f'(Tensor q, Tensor k, Tensor v, {_ARGS}) -> (Tensor, Tensor, Tensor)',
    _forward)
sema_attention_backward_op = define(
    'sema_attention_backward',
    f'(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor mean, {_ARGS})'
    ' -> (Tensor, Tensor, Tensor)', _backward)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, *ctx.args = inputs
    out, lse, mean = output
    ctx.mark_non_differentiable(lse, mean)
    # lse and mean get no gradient: without this autograd would fill zero tensors for them
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, mean)


def _autograd_backward(ctx, grad: Optional[torch.Tensor], _grad_lse, _grad_mean):
    n_args = len(ctx.args)
    if grad is None:  # the output did not reach the loss
        return (None, ) * (3 + n_args)
    grads = sema_attention_backward_op(grad, *ctx.saved_tensors, *ctx.args)
    return (*(g if n else None for g, n in zip(grads, ctx.needs_input_grad)),
            *(None, ) * n_args)


sema_attention_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def sema_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
                          window_size: int, scale: Optional[float] = None,
                          with_mean: bool = True,
                          input_precision: str = DEFAULT_INPUT_PRECISION,
                          out_layout: str = 'bhnd') -> torch.Tensor:
    """SEMA attention with the Triton kernels through ``mmeffattn::sema_attention``, no input
    validation (see ``op.sema_attention``). Returns ``[B, heads, N, D]`` (``out_layout='bhnd'``)
    or ``[B, N, heads, D]`` (``'bnhd'``), contiguous."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    hw: List[int] = list(hw)
    return sema_attention_op(q, k, v, hw, window_size, scale, with_mean, input_precision,
                             out_layout)[0]
