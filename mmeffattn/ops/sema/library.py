"""SEMA attention as the custom operators ``mmeffattn::sema_attention`` and
``mmeffattn::sema_attention_qk`` (q and k packed as one tensor), each with its ``_backward``; see
:mod:`mmeffattn.ops._library`. Importing this module needs Triton (``op.py`` guards it)."""
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._launch import unit_last_stride
from .._library import define, empty_like_none, none_if_empty
from .function import (DEFAULT_INPUT_PRECISION, qk_views, sema_bwd, sema_fwd,
                       window_geometry)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
             window_size: int, scale: float, with_mean: bool, input_precision: str,
             out_layout: str = 'bhnd', return_mean: bool = False
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, mean)`` of :func:`~.function.sema_fwd`, an absent one empty; the mean is
    differentiable only with ``return_mean`` (else the backward's record of the added mean)."""
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    o, lse, mean = sema_fwd(q, k, v, window_geometry(tuple(hw), window_size), scale, with_mean,
                            input_precision, out_layout, return_mean)
    return o, empty_like_none(o, lse), empty_like_none(o, mean)


def _backward(grad: torch.Tensor, grad_mean: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, mean: torch.Tensor,
              hw: Sequence[int], window_size: int, scale: float, with_mean: bool,
              input_precision: str, out_layout: str = 'bhnd', return_mean: bool = False
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``; ``grad_mean``: the returned mean's gradient (``return_mean``), empty
    when absent."""
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    return sema_bwd(grad, q, k, v, out, none_if_empty(lse), none_if_empty(mean),
                    window_geometry(tuple(hw), window_size), scale, with_mean, input_precision,
                    out_layout, grad_mean=none_if_empty(grad_mean), return_mean=return_mean)


_ARGS = ('SymInt[2] hw, int window_size, float scale, bool with_mean, str input_precision, '
         'str out_layout="bhnd", bool return_mean=False')
#: the position of ``return_mean`` among the arguments after the tensors
_RETURN_MEAN_ARG = 6
sema_attention_op = define(
    'sema_attention', f'(Tensor q, Tensor k, Tensor v, {_ARGS}) -> (Tensor, Tensor, Tensor)',
    _forward)
sema_attention_backward_op = define(
    'sema_attention_backward',
    f'(Tensor grad, Tensor grad_mean, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, '
    f'Tensor mean, {_ARGS}) -> (Tensor, Tensor, Tensor)', _backward)


def _register_autograd(op, backward_op, n_tensors: int) -> None:
    """The autograd of forward operator ``op``, whose first ``n_tensors`` arguments are
    differentiable; ``backward_op(grad, grad_mean, *tensors, out, lse, mean, *args)``."""
    def setup_context(ctx, inputs, output) -> None:
        ctx.args = inputs[n_tensors:]
        args = ctx.args
        ctx.return_mean = len(args) > _RETURN_MEAN_ARG and bool(args[_RETURN_MEAN_ARG])
        out, lse, mean = output
        # lse (and an added mean, saved for the backward) get no gradient; a returned mean does
        ctx.mark_non_differentiable(*((lse, ) if ctx.return_mean else (lse, mean)))
        # without this autograd would fill zero tensors for the absent gradients
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:n_tensors], out, lse, mean)

    def backward(ctx, grad: Optional[torch.Tensor], _grad_lse,
                 grad_mean: Optional[torch.Tensor]):
        n_args = len(ctx.args)
        if not ctx.return_mean:
            grad_mean = None
        if grad is None and grad_mean is None:  # no output reached the loss
            return (None, ) * (n_tensors + n_args)
        saved = ctx.saved_tensors
        if grad is None:  # only the returned mean reached the loss (rare: no shortcut for it)
            grad = torch.zeros_like(saved[n_tensors])
        grads = backward_op(grad, empty_like_none(grad, grad_mean), *saved, *ctx.args)
        return (*(g if n else None for g, n in zip(grads, ctx.needs_input_grad)),
                *(None, ) * n_args)
    op.register_autograd(backward, setup_context=setup_context)


_register_autograd(sema_attention_op, sema_attention_backward_op, 3)


# q and k packed: the backward stores dq and dk into one [B, N, 2, heads, D] gradient that
# autograd hands to the qk projection as is (no stack of dq and dk)
def _forward_qk(qk: torch.Tensor, v: torch.Tensor, hw: Sequence[int], window_size: int,
                scale: float, with_mean: bool, input_precision: str, out_layout: str = 'bhnd',
                return_mean: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_forward`` with ``qk`` ``[B, N, 2, heads, D]`` for q and k."""
    return _forward(*qk_views(unit_last_stride(qk)), v, hw, window_size, scale, with_mean,
                    input_precision, out_layout, return_mean)


def _backward_qk(grad: torch.Tensor, grad_mean: torch.Tensor, qk: torch.Tensor,
                 v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, mean: torch.Tensor,
                 hw: Sequence[int], window_size: int, scale: float, with_mean: bool,
                 input_precision: str, out_layout: str = 'bhnd', return_mean: bool = False
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(dqk, dv)``: dqk in qk's layout when that is dense (``empty_like``), so that the
    backward of the views qk came from stays views."""
    qk, v = unit_last_stride(qk), unit_last_stride(v)
    dqk = torch.empty_like(qk)
    _, _, dv = sema_bwd(grad, *qk_views(qk), v, out, none_if_empty(lse), none_if_empty(mean),
                        window_geometry(tuple(hw), window_size), scale, with_mean,
                        input_precision, out_layout, dqk=dqk,
                        grad_mean=none_if_empty(grad_mean), return_mean=return_mean)
    return dqk, dv


sema_attention_qk_op = define(
    'sema_attention_qk', f'(Tensor qk, Tensor v, {_ARGS}) -> (Tensor, Tensor, Tensor)',
    _forward_qk)
sema_attention_qk_backward_op = define(
    'sema_attention_qk_backward',
    f'(Tensor grad, Tensor grad_mean, Tensor qk, Tensor v, Tensor out, Tensor lse, '
    f'Tensor mean, {_ARGS}) -> (Tensor, Tensor)', _backward_qk)
_register_autograd(sema_attention_qk_op, sema_attention_qk_backward_op, 2)


def sema_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
                          window_size: int, scale: Optional[float] = None,
                          with_mean: bool = True,
                          input_precision: str = DEFAULT_INPUT_PRECISION,
                          out_layout: str = 'bhnd', return_mean: bool = False
                          ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``op.sema_attention`` on the Triton kernels through ``mmeffattn::sema_attention``,
    without input validation; out contiguous."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    hw: List[int] = list(hw)
    out, _, mean = sema_attention_op(q, k, v, hw, window_size, scale, with_mean,
                                     input_precision, out_layout, return_mean)
    return (out, mean) if return_mean else out


def sema_attention_qk_triton(qk: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
                             window_size: int, scale: Optional[float] = None,
                             with_mean: bool = True,
                             input_precision: str = DEFAULT_INPUT_PRECISION,
                             out_layout: str = 'bhnd', return_mean: bool = False
                             ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`sema_attention_triton` with q and k packed in ``qk`` ``[B, N, 2, heads, D]``
    (``mmeffattn::sema_attention_qk``)."""
    scale = qk.shape[-1] ** -0.5 if scale is None else float(scale)
    hw: List[int] = list(hw)
    out, _, mean = sema_attention_qk_op(qk, v, hw, window_size, scale, with_mean,
                                        input_precision, out_layout, return_mean)
    return (out, mean) if return_mean else out
