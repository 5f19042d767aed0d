"""Launchers, the large-matrix PyTorch path and the autograd Function of the Newton-Schulz
inverse.

Importing this module needs Triton (``op.py`` guards it). The kernels run compiled on CUDA
tensors and interpreted on CPU tensors when Triton's interpreter is on.

Matrices up to :data:`MAX_ONCHIP_M` run on chip, one program per matrix, one launch forward
and one backward: small ones entirely in registers (``newton_schulz_fwd_kernel``,
``newton_schulz_bwd_kernel``, up to :data:`MAX_REGISTER_MP`), larger ones with the iterates in a
per-program fp32 scratch that stays in L1/L2 and tiles in registers (the ``*_tiled_kernel`` ones).
Beyond ``MAX_ONCHIP_M`` the same iteration and the same hand-written backward run with batched
matmuls in PyTorch (fp32 for 16-bit inputs).

Memory: every path stores the ``iters`` iterates in the forward when a gradient is needed
(the kernels: ``iters * B * heads * MP * MP`` fp32 values, MP = M padded to a power of two >= 16;
the tiled forward one more slot, and a 2-slot scratch when no gradient is needed; the tiled
backward a 4-slot scratch; the PyTorch path: ``iters * B * heads * M * M`` in the compute dtype).
Recomputing them in the backward would cost a forward per step walked back (or checkpointing),
and the iteration cannot be run backwards.
"""
from typing import Dict, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._launch import (KernelConfig, Launch, device_guard as _device_guard,  # noqa: F401
                       launch as _launch, next_pow2 as _next_pow2, record_launches)
from . import kernels
from .naive import ALPHA_NUM, compute_dtype, initial_iterate, regularized

#: default ``tl.dot`` input precision: exact fp32 ('ieee'); TF32 rounds the operands to ~1e-3
#: relative, which would bound how close the iteration can get to the inverse.
DEFAULT_INPUT_PRECISION = 'ieee'
#: largest M kept on chip (one program per matrix); larger matrices take the batched-matmul
#: path
MAX_ONCHIP_M = 128
#: largest padded size MP whose forward / backward keeps whole matrices in registers; larger
#: ones use the tiled kernels (iterates in an L2-resident fp32 scratch, BT x BT tiles in
#: registers). Whole-matrix kernels spilled beyond these sizes in ahead-of-time compiles for
#: sm_80 / sm_90 (MP = 128 forward: 192 KB of shared memory for the tl.dot operands and a
#: stack; MP = 64 backward, which holds P, G, dP and V_k: a 1.6-6.7 KB stack at 8 warps,
#: 1.9 KB at 16).
MAX_REGISTER_MP = {'fwd': 64, 'bwd': 32}
#: warps of the whole-matrix kernels by MP, and of the tiled ones
REGISTER_WARPS = {'fwd': {16: 4, 32: 4, 64: 8}, 'bwd': {16: 4, 32: 8}}
TILED_WARPS = {'fwd': 4, 'bwd': 8}
#: the kernels' only storage dtype: the launchers convert matrices and gradients to fp32
#: ``[B*heads, MP, MP]`` zero-padded buffers and the results back (an M x M copy next to the
#: iteration's ~4 iters MP^3 flops); with a row stride M not a multiple of 16, ptxas spilled
#: (MP = 64 forward at M = 33 or 40: a 5.9 KB stack on sm_80)
KERNEL_DTYPE = torch.float32
#: tile side of the tiled kernels (a [BT, MP] row block is their largest register block)
TILE = 32


def padded_size(M: int) -> int:
    """M padded to a power of two >= 16 (the smallest tl.dot tile)."""
    return max(16, _next_pow2(M))


def newton_schulz_kernel_configs(M: int, store_iterates: bool = True,
                                 input_precision: str = DEFAULT_INPUT_PRECISION
                                 ) -> Dict[str, KernelConfig]:
    """The configurations the launchers use for ``M <= MAX_ONCHIP_M``, by role: ``'fwd'``,
    ``'bwd'``; whole-matrix kernels up to :data:`MAX_REGISTER_MP`, tiled ones beyond (tell
    them apart by ``config.kernel``).

    Args:
        M: matrix size.
        store_iterates: the forward keeps its iterates for the backward.
        input_precision: ``tl.dot`` precision.
    """
    mp = padded_size(M)
    common = dict(MP=mp, INPUT_PRECISION=input_precision)
    tiled = dict(common, BT=min(TILE, mp))
    if mp <= MAX_REGISTER_MP['fwd']:
        fwd = KernelConfig(kernels.newton_schulz_fwd_kernel,
                           dict(common, STORE_ITERATES=store_iterates),
                           num_warps=REGISTER_WARPS['fwd'][mp], num_stages=1)
    else:
        fwd = KernelConfig(kernels.newton_schulz_fwd_tiled_kernel, tiled,
                           num_warps=TILED_WARPS['fwd'], num_stages=1)
    if mp <= MAX_REGISTER_MP['bwd']:
        bwd = KernelConfig(kernels.newton_schulz_bwd_kernel, common,
                           num_warps=REGISTER_WARPS['bwd'][mp], num_stages=1)
    else:
        bwd = KernelConfig(kernels.newton_schulz_bwd_tiled_kernel, tiled,
                           num_warps=TILED_WARPS['bwd'], num_stages=1)
    return {'fwd': fwd, 'bwd': bwd}


def _is_tiled(cfg: KernelConfig) -> bool:
    return 'BT' in cfg.constexprs


def _padded(x: torch.Tensor, mp: int) -> torch.Tensor:
    """``[B, heads, M, M]`` -> contiguous fp32 ``[B*heads, MP, MP]``, zero outside the real
    block (a view when x already is that)."""
    B, heads, M, _ = x.shape
    if M == mp and x.dtype == KERNEL_DTYPE and x.is_contiguous():
        return x.view(B * heads, mp, mp)
    out = x.new_zeros((B * heads, mp, mp), dtype=KERNEL_DTYPE)
    out.view(B, heads, mp, mp)[:, :, :M, :M] = x
    return out


def _unpadded(x: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`_padded`: contiguous ``shape`` in ``dtype``."""
    B, heads, M, _ = shape
    mp = x.shape[-1]
    x = x.view(B, heads, mp, mp)
    if M == mp and x.dtype == dtype:
        return x
    return x[:, :, :M, :M].to(dtype, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------
# on-chip launchers (M <= MAX_ONCHIP_M)
# ---------------------------------------------------------------------------------------------
def newton_schulz_fwd(a: torch.Tensor, iters: int, eps: float, store_iterates: bool
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Forward launcher: ``(out, ws)``.

    Args:
        a: ``[B, heads, M, M]``, any strides, ``M <= MAX_ONCHIP_M``.
    Returns:
        out ``[B, heads, M, M]`` contiguous in a's dtype; ws fp32 ``[B*heads, n_slots, MP, MP]``
        with ``V_k`` in slot ``k < iters`` (None unless ``store_iterates``).
    """
    B, heads, M, _ = a.shape
    cfg = newton_schulz_kernel_configs(M, store_iterates)['fwd']
    mp = cfg.constexprs['MP']
    a_pad = _padded(a, mp)
    out = torch.empty_like(a_pad)
    with _device_guard(a):
        if _is_tiled(cfg):  # also keeps V_iters, or ping-pongs in 2 slots
            n_slots = iters + 1 if store_iterates else 2
            ws = a_pad.new_zeros((B * heads, n_slots, mp, mp))
            _launch('fwd', cfg, (B * heads,), a_pad, out, ws, M, iters, n_slots, eps,
                    ALPHA_NUM)
        else:
            ws = a_pad.new_empty((B * heads, iters if store_iterates else 0, mp, mp))
            _launch('fwd', cfg, (B * heads,), a_pad, out, ws, M, iters, eps, ALPHA_NUM)
    return _unpadded(out, a.shape, a.dtype), (ws if store_iterates else None)


def newton_schulz_bwd(g: torch.Tensor, a: torch.Tensor, ws: Optional[torch.Tensor], iters: int,
                      eps: float) -> torch.Tensor:
    """Backward launcher: dL/da ``[B, heads, M, M]`` contiguous in a's dtype.

    Args:
        g: gradient of the output (any strides); ws: the forward's iterates (None when
            ``iters == 0``).
    """
    B, heads, M, _ = a.shape
    cfg = newton_schulz_kernel_configs(M)['bwd']
    mp = cfg.constexprs['MP']
    a_pad, g_pad = _padded(a, mp), _padded(g, mp)
    da = torch.empty_like(a_pad)
    if ws is None:  # iters == 0: nothing stored, nothing read
        ws = a_pad.new_empty((B * heads, 0, mp, mp))
    args = (M, iters, ws.shape[1], eps, ALPHA_NUM)
    with _device_guard(a):
        if _is_tiled(cfg):
            scratch = a_pad.new_zeros((B * heads, 4, mp, mp))
            _launch('bwd', cfg, (B * heads,), a_pad, g_pad, ws, scratch, da, *args)
        else:
            _launch('bwd', cfg, (B * heads,), a_pad, g_pad, ws, da, *args)
    return _unpadded(da, a.shape, a.dtype)


# ---------------------------------------------------------------------------------------------
# batched-matmul path (M > MAX_ONCHIP_M)
# ---------------------------------------------------------------------------------------------
def newton_schulz_fwd_torch(a: torch.Tensor, iters: int, eps: float, store_iterates: bool
                            ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The forward with batched matmuls: ``(out, iterates)``, iterates ``[iters, B, heads, M,
    M]`` in the compute dtype (None unless ``store_iterates``)."""
    p = regularized(a.to(compute_dtype(a.dtype)), eps)
    v = initial_iterate(p)
    kept = []
    for _ in range(iters):
        if store_iterates:
            kept.append(v)
        v = 2 * v - (v @ p) @ v
    return v.to(a.dtype), (torch.stack(kept) if store_iterates and iters else None)


def newton_schulz_bwd_torch(g: torch.Tensor, a: torch.Tensor, iterates: Optional[torch.Tensor],
                            iters: int, eps: float) -> torch.Tensor:
    """The kernels' backward (same recursion, see ``newton_schulz_bwd_kernel``) with batched
    matmuls, in the compute dtype; returns dL/da in a's dtype."""
    p = regularized(a.to(compute_dtype(a.dtype)), eps)
    g = g.to(p.dtype)
    dp = torch.zeros_like(p)
    pt = p.transpose(-1, -2)
    for k in reversed(range(iters)):
        vt = iterates[k].transpose(-1, -2)
        vtg = vt @ g
        dp -= vtg @ vt
        g = 2 * g - pt @ vtg - (g @ vt) @ pt
    rows = p.sum(-1)  # [B, heads, M]
    s = rows.amax(-1, keepdim=True)  # [B, heads, 1]
    alpha = ALPHA_NUM / (s * s)
    ds = -2 * alpha / s * (g * p).sum((-1, -2))[..., None]  # [B, heads, 1]
    top = (rows == s).to(p.dtype)  # [B, heads, M]
    dp += alpha[..., None] * g + (ds / top.sum(-1, keepdim=True) * top)[..., None]
    return dp.to(a.dtype)


class NewtonSchulzFunction(torch.autograd.Function):
    """Autograd wrapper of both paths (first-order gradient for a)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        store = ctx.needs_input_grad[0] and iters > 0
        onchip = a.shape[-1] <= MAX_ONCHIP_M
        fwd = newton_schulz_fwd if onchip else newton_schulz_fwd_torch
        out, ws = fwd(a, iters, eps, store)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(a, ws)
        ctx.iters, ctx.eps, ctx.onchip = iters, eps, onchip
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        a, ws = ctx.saved_tensors
        bwd = newton_schulz_bwd if ctx.onchip else newton_schulz_bwd_torch
        return bwd(g, a, ws, ctx.iters, ctx.eps), None, None


def newton_schulz_pinv_triton(a: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The Newton-Schulz inverse with the Triton kernels (batched matmuls beyond
    :data:`MAX_ONCHIP_M`), no input validation (see ``op.newton_schulz_pinv``)."""
    return NewtonSchulzFunction.apply(a, int(iters), float(eps))
