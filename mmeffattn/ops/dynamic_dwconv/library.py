"""Custom operators ``mmeffattn::dynamic_dwconv`` and its backward (``_library.py``)."""
from typing import Optional, Sequence, Tuple

import torch

from .._library import define, empty_like_none
from .function import dynamic_dwconv_bwd, dynamic_dwconv_fwd


def _forward(x: torch.Tensor, kernel: torch.Tensor, bias: Optional[torch.Tensor],
             weight: Optional[torch.Tensor], normalize: bool) -> torch.Tensor:
    return dynamic_dwconv_fwd(x, kernel, bias, weight, normalize)


def _backward(grad: torch.Tensor, x: torch.Tensor, kernel: torch.Tensor,
              weight: Optional[torch.Tensor], normalize: bool, has_bias: bool,
              needs: Sequence[bool]) -> Tuple[torch.Tensor, ...]:
    grads = dynamic_dwconv_bwd(grad, x, kernel, weight, normalize, has_bias, tuple(needs))
    return tuple(empty_like_none(x, g) for g in grads)


dynamic_dwconv_op = define(
    'dynamic_dwconv', '(Tensor x, Tensor kernel, Tensor? bias, Tensor? weight, bool normalize) '
    '-> Tensor', _forward)
dynamic_dwconv_backward_op = define(
    'dynamic_dwconv_backward', '(Tensor grad, Tensor x, Tensor kernel, Tensor? weight, '
    'bool normalize, bool has_bias, bool[4] needs) -> (Tensor, Tensor, Tensor, Tensor)',
    _backward)


def _setup_context(ctx, inputs, output) -> None:
    x, kernel, bias, weight, ctx.normalize = inputs
    ctx.save_for_backward(x, kernel, weight)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _autograd_backward(ctx, grad: torch.Tensor):
    x, kernel, weight = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    grads = dynamic_dwconv_backward_op(grad, x, kernel, weight, ctx.normalize,
                                       ctx.bias_dtype is not None, needs)
    dx, dkernel, dbias, dweight = (g if n and g.numel() else None for g, n in zip(grads, needs))
    if dbias is not None:
        dbias = dbias.to(ctx.bias_dtype)
    return dx, dkernel, dbias, dweight, None


dynamic_dwconv_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def dynamic_dwconv_triton(x: torch.Tensor, kernel: torch.Tensor,
                          bias: Optional[torch.Tensor] = None,
                          weight: Optional[torch.Tensor] = None,
                          normalize: bool = False) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.dynamic_dwconv``."""
    return dynamic_dwconv_op(x, kernel, bias, weight, bool(normalize))
