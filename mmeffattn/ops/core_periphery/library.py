"""Custom operators ``mmeffattn::core_periphery_attention`` and its backward (``_library.py``)."""
from typing import Optional, Sequence, Tuple

import torch

from .._launch import unit_last_stride
from .._library import define, empty_like_none
from .function import DEFAULT_INPUT_PRECISION, core_periphery_bwd, core_periphery_fwd

def _prepare(*tensors: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
    """Unit stride on D (the launchers align the rope tables' strides)."""
    return tuple(None if x is None else unit_last_stride(x) for x in tensors)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: Optional[torch.Tensor],
             sin: Optional[torch.Tensor], num_cores: int, scale: float, input_precision: str,
             splits: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``; the log-sum-exp is what the backward reads."""
    return core_periphery_fwd(*_prepare(q, k, v, cos, sin), num_cores, scale, input_precision,
                              splits)


def _backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], out: torch.Tensor,
              lse: torch.Tensor, num_cores: int, scale: float, input_precision: str,
              splits: Optional[int], needs: Sequence[bool]) -> Tuple[torch.Tensor, ...]:
    q, k, v, cos, sin = _prepare(q, k, v, cos, sin)
    dq, dk, dv, dcos, dsin = core_periphery_bwd(grad, q, k, v, cos, sin, out, lse, num_cores,
                                                scale, input_precision, splits,
                                                rope_grad=needs[3] or needs[4])
    return tuple(empty_like_none(q, g if n else None)
                 for g, n in zip((dq, dk, dv, dcos, dsin), needs))


_ARGS = 'int num_cores, float scale, str input_precision, int? splits'
core_periphery_attention_op = define(
    'core_periphery_attention',
    f'(Tensor q, Tensor k, Tensor v, Tensor? cos, Tensor? sin, {_ARGS}) -> (Tensor, Tensor)',
    _forward)
core_periphery_attention_backward_op = define(
    'core_periphery_attention_backward',
    f'(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? cos, Tensor? sin, Tensor out, '
    f'Tensor lse, {_ARGS}, bool[5] needs) -> (Tensor, Tensor, Tensor, Tensor, Tensor)',
    _backward)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cos, sin, *ctx.args = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, cos, sin, out, lse)


def _autograd_backward(ctx, grad: torch.Tensor, _grad_lse):
    needs = list(ctx.needs_input_grad[:5])
    grads = core_periphery_attention_backward_op(grad, *ctx.saved_tensors, *ctx.args, needs)
    return (*(g if n else None for g, n in zip(grads, needs)), None, None, None, None)


core_periphery_attention_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def core_periphery_attention_triton(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, scale: Optional[float] = None,
        input_precision: str = DEFAULT_INPUT_PRECISION,
        splits: Optional[int] = None) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.core_periphery_attention``; rope tables are cast
    to q's dtype here, with autograd."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    cos = sin = None
    if rope is not None:
        cos, sin = rope[0].to(q.dtype), rope[1].to(q.dtype)
    return core_periphery_attention_op(q, k, v, cos, sin, num_cores, scale, input_precision,
                                       splits)[0]
