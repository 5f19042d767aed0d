"""Triton kernels of the per-sample dynamic depthwise convolution; launchers in ``function.py``.

Tensors ``[B, C, H, W]`` with any strides; taps ``kernel * inv + weight`` (``inv = 1 /
(||kernel|| + 1)`` when NORMALIZE) are recomputed per program; stride 1, zero padding ``K // 2``;
the tap loop is not unrolled (unrolled, ptxas spilled); fp32 arithmetic.
"""
import triton
import triton.language as tl

from .._common_kernels import row_norm_grad


@triton.jit
def _tap(kernel, weight, o_c, m_c, b_inv, t, KK: tl.constexpr, NORMALIZE: tl.constexpr,
         HAS_WEIGHT: tl.constexpr):
    """Effective tap ``t`` of the channels ``o_c`` ([BC], fp32); ``kernel`` points at the
    sample's ``[C, K*K]`` kernels."""
    b_t = tl.load(kernel + o_c * KK + t, mask=m_c, other=0.).to(tl.float32)  # [BC]
    if NORMALIZE:
        b_t = b_t * b_inv
    if HAS_WEIGHT:
        b_t += tl.load(weight + o_c * KK + t, mask=m_c, other=0.).to(tl.float32)
    return b_t


@triton.jit
def _inv_norm(kernel, o_c, m_c, BC: tl.constexpr, KK: tl.constexpr):
    """``1 / (||kernel[c, :]|| + 1)`` for the channels ``o_c`` ([BC], fp32); a loop over the
    taps (a ``[BC, K*K]`` tile cost ptxas up to ~100 registers more at K = 9)."""
    b_ss = tl.zeros([BC], dtype=tl.float32)  # [BC]
    for t in tl.range(0, KK, loop_unroll_factor=1):
        b_k = tl.load(kernel + o_c * KK + t, mask=m_c, other=0.).to(tl.float32)  # [BC]
        b_ss += b_k * b_k
    return 1. / (tl.sqrt(b_ss) + 1.)


@triton.jit
def _pixel_channel_tile(C, H, W, BC: tl.constexpr, BP: tl.constexpr):
    """``(o_c, m_c, o_p, m_p, o_h, o_w, i_b)`` of this program's ``BP x BC`` tile."""
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)  # [BC]
    o_p = tl.program_id(0) * BP + tl.arange(0, BP)  # [BP]
    return o_c, o_c < C, o_p, o_p < H * W, o_p // W, o_p % W, tl.program_id(2).to(tl.int64)


@triton.jit
def _shifted(x, o_h, o_w, dh, dw, m_p, o_c, m_c, H, W, stride_h, stride_w, stride_c):
    """``(tile, m_s)``: x at pixels ``(o_h + dh, o_w + dw)`` ([BP, BC] fp32, zero outside the
    map) and the mask of the pixels inside it ([BP])."""
    o_hh = o_h + dh  # [BP]
    o_ww = o_w + dw  # [BP]
    m_s = m_p & (o_hh >= 0) & (o_hh < H) & (o_ww >= 0) & (o_ww < W)  # [BP]
    b_x = tl.load(x + (o_hh * stride_h + o_ww * stride_w)[:, None] + o_c[None, :] * stride_c,
                  mask=m_s[:, None] & m_c[None, :], other=0.).to(tl.float32)  # [BP, BC]
    return b_x, m_s


@triton.jit
def dynamic_dwconv_fwd_kernel(
    x, kernel, weight, bias, out,
    stride_xb, stride_xc, stride_xh, stride_xw,
    stride_kb,
    stride_ob, stride_oc, stride_oh, stride_ow,
    C, H, W,
    K: tl.constexpr, BC: tl.constexpr, BP: tl.constexpr,
    NORMALIZE: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """out = dwconv(x, effective kernel) (+ bias): one ``BP x BC`` output tile per program."""
    o_c, m_c, o_p, m_p, o_h, o_w, i_b = _pixel_channel_tile(C, H, W, BC, BP)
    x += i_b * stride_xb
    kernel += i_b * stride_kb
    out += i_b * stride_ob
    KK: tl.constexpr = K * K
    PAD: tl.constexpr = K // 2
    b_inv = _inv_norm(kernel, o_c, m_c, BC, KK) if NORMALIZE else 1.

    b_acc = tl.zeros([BP, BC], dtype=tl.float32)  # [BP, BC]
    for t in tl.range(0, KK, loop_unroll_factor=1):
        b_tap = _tap(kernel, weight, o_c, m_c, b_inv, t, KK, NORMALIZE, HAS_WEIGHT)  # [BC]
        b_x, m_s = _shifted(x, o_h, o_w, t // K - PAD, t % K - PAD, m_p, o_c, m_c, H, W,
                            stride_xh, stride_xw, stride_xc)  # [BP, BC]
        # a tap that lands on the padding adds nothing, even a NaN / inf one (0 * NaN = NaN)
        b_acc += tl.where(m_s[:, None], b_x * b_tap[None, :], 0.)
    if HAS_BIAS:
        b_acc += tl.load(bias + o_c, mask=m_c, other=0.).to(tl.float32)[None, :]
    tl.store(out + (o_h * stride_oh + o_w * stride_ow)[:, None] + o_c[None, :] * stride_oc,
             b_acc.to(out.dtype.element_ty), mask=m_p[:, None] & m_c[None, :])


@triton.jit
def dynamic_dwconv_bwd_kernel(
    x, kernel, weight, dy, dx, part,
    stride_xb, stride_xc, stride_xh, stride_xw,
    stride_kb,
    stride_dyb, stride_dyc, stride_dyh, stride_dyw,
    stride_dxb, stride_dxc, stride_dxh, stride_dxw,
    C, H, W, n_pix_tiles, tiles_per_prog, n_groups,
    K: tl.constexpr, BC: tl.constexpr, BP: tl.constexpr, BKK: tl.constexpr,
    NORMALIZE: tl.constexpr, HAS_WEIGHT: tl.constexpr, NEEDS_DX: tl.constexpr,
    NEEDS_DK: tl.constexpr,
):
    """``dx[p] = sum_t dy[p - off_t] tap_t`` over ``tiles_per_prog`` tiles, and (NEEDS_DK)
    the group's sums ``part [B, n_groups, C, K*K + 1]``: ``sum_p dy[p] x[p + off_t]`` per tap,
    then ``sum_p dy[p]``. Grid: ``(n_groups, channel tiles, B)``.
    """
    i_g = tl.program_id(0)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)  # [BC]
    m_c = o_c < C
    i_b = tl.program_id(2).to(tl.int64)
    x += i_b * stride_xb
    kernel += i_b * stride_kb
    dy += i_b * stride_dyb
    dx += i_b * stride_dxb
    KK: tl.constexpr = K * K
    PAD: tl.constexpr = K // 2
    o_t = tl.arange(0, BKK)  # [BKK] taps, then the bias slot
    if NEEDS_DX:
        b_inv = _inv_norm(kernel, o_c, m_c, BC, KK) if NORMALIZE else 1.
    if NEEDS_DK:
        b_part = tl.zeros([BKK, BC], dtype=tl.float32)  # [BKK, BC]
    tile_end = tl.minimum((i_g + 1) * tiles_per_prog, n_pix_tiles)
    for i_p in tl.range(i_g * tiles_per_prog, tile_end, loop_unroll_factor=1):
        o_p = i_p * BP + tl.arange(0, BP)  # [BP]
        m_p = o_p < H * W
        o_h = o_p // W
        o_w = o_p % W
        m_pc = m_p[:, None] & m_c[None, :]  # [BP, BC]
        if NEEDS_DK:
            b_dy = tl.load(dy + (o_h * stride_dyh + o_w * stride_dyw)[:, None]
                           + o_c[None, :] * stride_dyc, mask=m_pc,
                           other=0.).to(tl.float32)  # [BP, BC]
            b_part += tl.where(o_t[:, None] == KK, tl.sum(b_dy, 0)[None, :], 0.)
        if NEEDS_DX:
            b_dx = tl.zeros([BP, BC], dtype=tl.float32)  # [BP, BC]
        for t in tl.range(0, KK, loop_unroll_factor=1):
            if NEEDS_DX:
                b_tap = _tap(kernel, weight, o_c, m_c, b_inv, t, KK, NORMALIZE,
                             HAS_WEIGHT)  # [BC]
                b_dys, m_s = _shifted(dy, o_h, o_w, PAD - t // K, PAD - t % K, m_p, o_c, m_c,
                                      H, W, stride_dyh, stride_dyw, stride_dyc)  # [BP, BC]
                b_dx += tl.where(m_s[:, None], b_dys * b_tap[None, :], 0.)
            if NEEDS_DK:
                b_xs, _ = _shifted(x, o_h, o_w, t // K - PAD, t % K - PAD, m_p, o_c, m_c, H, W,
                                   stride_xh, stride_xw, stride_xc)  # [BP, BC]
                b_part += tl.where(o_t[:, None] == t, tl.sum(b_dy * b_xs, 0)[None, :], 0.)
        if NEEDS_DX:
            tl.store(dx + (o_h * stride_dxh + o_w * stride_dxw)[:, None]
                     + o_c[None, :] * stride_dxc, b_dx.to(dx.dtype.element_ty), mask=m_pc)
    if NEEDS_DK:
        p_part = part + ((i_b * n_groups + i_g) * C + o_c[None, :]) * (KK + 1) + o_t[:, None]
        tl.store(p_part, b_part, mask=(o_t < KK + 1)[:, None] & m_c[None, :])


@triton.jit
def dynamic_dwconv_bwd_reduce_kernel(
    kernel, part, dkernel, red,
    stride_kb,
    C, n_groups,
    K: tl.constexpr, BC: tl.constexpr, BKK: tl.constexpr, NORMALIZE: tl.constexpr,
):
    """Sum a sample's group partials into ``red [B, C, K*K + 1]`` (the effective kernel's
    gradient G, then the bias's) and write ``dkernel``: G, or with NORMALIZE its gradient
    through the normalization (``row_norm_grad``)."""
    i_c = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    kernel += i_b * stride_kb
    dkernel += i_b * stride_kb
    KK: tl.constexpr = K * K

    o_c = i_c * BC + tl.arange(0, BC)  # [BC]
    m_c = o_c < C  # [BC]
    o_t = tl.arange(0, BKK)  # [BKK]
    m_t1 = m_c[:, None] & (o_t < KK + 1)[None, :]  # [BC, BKK] taps and the bias slot
    p_part = part + (i_b * n_groups * C + o_c[:, None]) * (KK + 1) + o_t[None, :]  # [BC, BKK]
    b_acc = tl.zeros([BC, BKK], dtype=tl.float32)  # [BC, BKK]
    for i_t in range(n_groups):
        b_acc += tl.load(p_part + i_t * C * (KK + 1), mask=m_t1, other=0.)
    tl.store(red + (i_b * C + o_c[:, None]) * (KK + 1) + o_t[None, :], b_acc, mask=m_t1)

    m_t = m_c[:, None] & (o_t < KK)[None, :]  # [BC, BKK] taps only
    b_g = tl.where(m_t, b_acc, 0.)  # [BC, BKK]
    if NORMALIZE:
        b_r = tl.load(kernel + o_c[:, None] * KK + o_t[None, :], mask=m_t,
                      other=0.).to(tl.float32)  # [BC, BKK]
        b_g = row_norm_grad(b_r, b_g, tl.sqrt(tl.sum(b_r * b_r, 1)), tl.sum(b_g * b_r, 1))
    tl.store(dkernel + o_c[:, None] * KK + o_t[None, :], b_g.to(dkernel.dtype.element_ty),
             mask=m_t)
