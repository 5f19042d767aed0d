"""Triton code the ops' kernels share: ``@triton.jit`` helpers (inlined where called) and the
softmax-backward delta pre-pass with its launcher."""
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import bh_strides
from ._launch import KernelConfig, launch, next_pow2

#: tokens per program of the delta pre-pass, by padded head dim
DELTA_BLOCK_N = {16: 128, 32: 64, 64: 32, 128: 16}


@triton.jit
def head_dim_mask(D, BD: tl.constexpr, EVEN_D: tl.constexpr):
    """``o_d`` ([BD] head-dim offsets) and their mask; with ``EVEN_D`` (D == BD) the mask is a
    compile-time all-true one, so loads and stores stay unmasked and vectorised along D."""
    o_d = tl.arange(0, BD)  # [BD]
    if EVEN_D:
        m_d = tl.full([BD], 1, tl.int1)
    else:
        m_d = o_d < D
    return o_d, m_d


@triton.jit
def bh_offset(i_bh, n_heads, stride_b, stride_h):
    """int64 offset of the (batch, head) slice ``i_bh = b * n_heads + h`` of a tensor."""
    return (i_bh // n_heads).to(tl.int64) * stride_b + (i_bh % n_heads).to(tl.int64) * stride_h


@triton.jit
def load_rows(x, o_n, stride_n, o_d, mask):
    """The ``[len(o_n), len(o_d)]`` tile of rows ``o_n`` and unit-stride columns ``o_d`` of x,
    zero where ``mask`` is False, in x's dtype."""
    return tl.load(x + o_n[:, None] * stride_n + o_d[None, :], mask=mask, other=0.)


@triton.jit
def store_rows(x, o_n, stride_n, o_d, b_x, mask):
    """Store the tile ``b_x`` at rows ``o_n`` and unit-stride columns ``o_d`` of x, cast to x's
    dtype, where ``mask`` is True."""
    tl.store(x + o_n[:, None] * stride_n + o_d[None, :], b_x.to(x.dtype.element_ty), mask=mask)


@triton.jit
def row_norm_grad(b_r, b_g, b_n, b_c):
    """The gradient through ``R_j / (n_j + 1)``, ``n_j = ||R_j||``, given ``b_g`` at the output
    and ``c_j = g_j . R_j``: ``g / (n + 1) - R c / (n (n + 1)^2)``; ``g`` where n = 0, as torch's
    norm backward."""
    b_inv = 1. / (b_n + 1.)
    b_coef = tl.where(b_n > 0., b_c * b_inv * b_inv / tl.where(b_n > 0., b_n, 1.), 0.)
    return b_g * b_inv[:, None] - b_r * b_coef[:, None]


@triton.jit(do_not_specialize=['n_heads', 'N'])
def softmax_bwd_delta_kernel(
    o, do, mean, delta,
    stride_ob, stride_oh, stride_on,
    stride_dob, stride_doh, stride_don,
    n_heads, N, D,
    BD: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr, WITH_MEAN: tl.constexpr,
):
    """delta[bh, n] = sum_d dO[n, d] * (O[n, d] - mean[d]), the softmax backward's row term
    (``mean`` only if WITH_MEAN)."""
    i_nb = tl.program_id(0)
    i_bh = tl.program_id(1)
    o += bh_offset(i_bh, n_heads, stride_ob, stride_oh)
    do += bh_offset(i_bh, n_heads, stride_dob, stride_doh)

    o_n = i_nb * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    o_d, m_d = head_dim_mask(D, BD, EVEN_D)  # [BD]
    m_n = o_n < N  # [BLOCK_N]
    m_nd = m_n[:, None] & m_d[None, :]  # [BLOCK_N, BD]
    b_o = load_rows(o, o_n, stride_on, o_d, m_nd).to(tl.float32)
    b_do = load_rows(do, o_n, stride_don, o_d, m_nd).to(tl.float32)
    if WITH_MEAN:
        b_o -= tl.load(mean + i_bh * D + o_d, mask=m_d, other=0.)[None, :]
    tl.store(delta + i_bh.to(tl.int64) * N + o_n, tl.sum(b_o * b_do, 1), mask=m_n)


def delta_config(head_dim: int, with_mean: bool) -> KernelConfig:
    """The pre-pass configuration for ``head_dim`` (padded to a power of two >= 16)."""
    bd = max(16, next_pow2(head_dim))
    return KernelConfig(softmax_bwd_delta_kernel,
                        dict(BD=bd, EVEN_D=head_dim == bd, BLOCK_N=DELTA_BLOCK_N[bd],
                             WITH_MEAN=with_mean), 4, 1)


def softmax_bwd_delta(cfg: KernelConfig, o: torch.Tensor, do: torch.Tensor,
                      mean: Optional[torch.Tensor] = None, role: str = 'bwd_preprocess'
                      ) -> torch.Tensor:
    """Launch the pre-pass on ``o``, ``do`` ``[B, heads, N, D]`` (unit stride on D); returns
    delta ``[B*heads, N]`` fp32. ``mean`` ``[B*heads, D]`` fp32 is subtracted from o first."""
    B, nh, N, D = o.shape
    delta = torch.empty((B * nh, N), dtype=torch.float32, device=o.device)
    launch(role, cfg, (-(-N // cfg.constexprs['BLOCK_N']), B * nh),
           o, do, o if mean is None else mean, delta, *bh_strides(o), *bh_strides(do), nh, N, D)
    return delta
