"""Custom operators ``mmeffattn::laplacian_kernel`` and its backward (``_library.py``)."""
from typing import Tuple

import torch

from .._common import INT32_LIMIT
from .._launch import unit_last_stride
from .._library import define, empty_like_none
from .function import laplacian_bwd, laplacian_fwd


def _forward(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    return laplacian_fwd(unit_last_stride(x), unit_last_stride(y), lam)


def _backward(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor,
              lam: float, needs: Tuple[bool, bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    N, M = out.shape[2:]
    if (N - 1) * abs(grad.stride(2)) + (M - 1) * abs(grad.stride(3)) >= INT32_LIMIT:
        grad = grad.contiguous()  # an unusual upstream gradient is copied (int32 offsets)
    x, y = unit_last_stride(x), unit_last_stride(y)
    dx, dy = laplacian_bwd(grad, x, y, out, lam, (needs[0], needs[1]))
    return empty_like_none(x, dx), empty_like_none(x, dy)


laplacian_kernel_op = define(
    'laplacian_kernel', '(Tensor x, Tensor y, float lam) -> Tensor', _forward)
laplacian_kernel_backward_op = define(
    'laplacian_kernel_backward',
    '(Tensor grad, Tensor x, Tensor y, Tensor out, float lam, bool[2] needs) -> (Tensor, Tensor)',
    _backward)


def _setup_context(ctx, inputs, output) -> None:
    x, y, lam = inputs
    ctx.save_for_backward(x, y, output)
    ctx.lam = lam


def _autograd_backward(ctx, grad: torch.Tensor):
    x, y, out = ctx.saved_tensors
    needs = ctx.needs_input_grad[:2]
    dx, dy = laplacian_kernel_backward_op(grad, x, y, out, ctx.lam, list(needs))
    return dx if needs[0] else None, dy if needs[1] else None, None


laplacian_kernel_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def laplacian_kernel_triton(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Unvalidated Triton entry point of ``op.laplacian_kernel``."""
    return laplacian_kernel_op(x, y, float(lam))
