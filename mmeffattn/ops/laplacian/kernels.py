"""Triton kernels of LaplacianFormer's Laplacian kernel ``exp(-||x_i - y_j||_1 / lam)``.

Token tensors are ``[B, heads, tokens, D]`` (unit stride on D); ``program_id(1) = b * heads +
h``. No ``tl.dot`` and no reduction over a tile axis (shuffles): the forward loops over D one
column at a time on a register output tile, the backward over one token set one token at a
time. All arithmetic is fp32 (an fp16 sum of D distances overflows).
"""
import triton
import triton.language as tl

from .._common_kernels import bh_offset, load_rows, store_rows


@triton.jit
def _tile(n_rows, n_cols, BR: tl.constexpr, BC: tl.constexpr):
    """``(o_r, m_r, o_c, m_c, i_bh)`` of this program's tile (column tiles fastest)."""
    n_col_tiles = tl.cdiv(n_cols, BC)
    o_r = (tl.program_id(0) // n_col_tiles) * BR + tl.arange(0, BR)  # [BR]
    o_c = (tl.program_id(0) % n_col_tiles) * BC + tl.arange(0, BC)  # [BC]
    return o_r, o_r < n_rows, o_c, o_c < n_cols, tl.program_id(1)


@triton.jit
def laplacian_fwd_kernel(
    x, y, out,
    stride_xb, stride_xh, stride_xn,
    stride_yb, stride_yh, stride_yn,
    stride_ob, stride_oh, stride_on,
    heads, N, M, D, neg_log2e_over_lam,
    BN: tl.constexpr, BM: tl.constexpr,
):
    """out[b, h, i, j] = exp2(-log2(e) / lam * sum_d |x_id - y_jd|) for one ``BN x BM`` tile
    (grid ``(N tiles * M tiles, B * heads)``, M fastest)."""
    o_n, m_n, o_m, m_m, i_bh = _tile(N, M, BN, BM)
    x += bh_offset(i_bh, heads, stride_xb, stride_xh)
    y += bh_offset(i_bh, heads, stride_yb, stride_yh)
    out += bh_offset(i_bh, heads, stride_ob, stride_oh)
    b_dist = tl.zeros([BN, BM], dtype=tl.float32)  # [BN, BM]
    p_x = x + o_n * stride_xn  # [BN]
    p_y = y + o_m * stride_yn  # [BM]
    # one column of x and y per step; padded rows load 0 and are masked at the store
    for d in range(0, D):
        b_xd = tl.load(p_x + d, mask=m_n, other=0.).to(tl.float32)  # [BN]
        b_yd = tl.load(p_y + d, mask=m_m, other=0.).to(tl.float32)  # [BM]
        b_dist += tl.abs(b_xd[:, None] - b_yd[None, :])
    b_out = tl.exp2(b_dist * neg_log2e_over_lam)  # [BN, BM]
    tl.store(out + o_n[:, None] * stride_on + o_m[None, :], b_out.to(out.dtype.element_ty),
             mask=m_n[:, None] & m_m[None, :])


@triton.jit
def laplacian_bwd_kernel(
    x, y, g, out, dx, dy_part,
    stride_xb, stride_xh, stride_xn,
    stride_yb, stride_yh, stride_yn,
    stride_gb, stride_gh, stride_gn, stride_gm,
    stride_ob, stride_oh, stride_on, stride_om,
    heads, N, M, D, neg_inv_lam, rows_per_prog, n_d_blocks,
    BR: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
    NEEDS_DX: tl.constexpr, NEEDS_DY: tl.constexpr,
):
    """Both gradients from one pass over ``g * out``, dy as split partial sums.

    With ``w = g * out`` and ``s = sign(x_id - y_jd)`` (sign(0) = 0)::

        dx[i, d] = -1/lam sum_j w_ij s_ijd        dy[j, d] = +1/lam sum_i w_ij s_ijd

    A program owns a split of x rows, all of y and ``BD`` columns of D: phase 1 gives its dx,
    phase 2 its partial dy ``dy_part [n_row_splits, B * heads, M, D]`` (fp32, summed by torch).
    """
    i_bh = tl.program_id(1)
    i_d = tl.program_id(0) % n_d_blocks
    i_r = tl.program_id(0) // n_d_blocks
    x += bh_offset(i_bh, heads, stride_xb, stride_xh)
    y += bh_offset(i_bh, heads, stride_yb, stride_yh)
    g += bh_offset(i_bh, heads, stride_gb, stride_gh)
    out += bh_offset(i_bh, heads, stride_ob, stride_oh)
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_d = o_d < D
    r0 = i_r * rows_per_prog
    r1 = tl.minimum(r0 + rows_per_prog, N)

    if NEEDS_DX:  # phase 1: [BR, BD] chunks of x rows, one y row at a time
        p_dx = dx + i_bh.to(tl.int64) * N * D
        for c0 in range(r0, r1, BR):
            o_n = c0 + tl.arange(0, BR)  # [BR]
            m_n = o_n < r1
            m_nd = m_n[:, None] & m_d[None, :]
            b_x = load_rows(x, o_n, stride_xn, o_d, m_nd).to(tl.float32)  # [BR, BD]
            b_dx = tl.zeros([BR, BD], dtype=tl.float32)
            for j in range(0, M):
                b_w = tl.load(g + o_n * stride_gn + j * stride_gm, mask=m_n,
                              other=0.).to(tl.float32)  # [BR]
                b_w *= tl.load(out + o_n * stride_on + j * stride_om, mask=m_n,
                               other=0.).to(tl.float32)
                b_yj = tl.load(y + j * stride_yn + o_d, mask=m_d, other=0.).to(tl.float32)
                b_diff = b_x - b_yj[None, :]  # [BR, BD]
                # sign(0) = 0 as torch.sign; a product, so a NaN weight propagates
                b_sgn = (b_diff > 0).to(tl.float32) - (b_diff < 0).to(tl.float32)
                b_dx += b_w[:, None] * b_sgn
            store_rows(p_dx, o_n, D, o_d, b_dx * neg_inv_lam, m_nd)

    if NEEDS_DY:  # phase 2: [BM, BD] tiles of y, one x row at a time
        p_dy = dy_part + (i_r * tl.num_programs(1) + i_bh).to(tl.int64) * M * D
        for j0 in range(0, M, BM):
            o_m = j0 + tl.arange(0, BM)  # [BM]
            m_m = o_m < M
            m_md = m_m[:, None] & m_d[None, :]
            b_y = load_rows(y, o_m, stride_yn, o_d, m_md).to(tl.float32)  # [BM, BD]
            b_dy = tl.zeros([BM, BD], dtype=tl.float32)
            for i in range(r0, r1):
                b_w = tl.load(g + i * stride_gn + o_m * stride_gm, mask=m_m,
                              other=0.).to(tl.float32)  # [BM]
                b_w *= tl.load(out + i * stride_on + o_m * stride_om, mask=m_m,
                               other=0.).to(tl.float32)
                b_xi = tl.load(x + i * stride_xn + o_d, mask=m_d, other=0.).to(tl.float32)
                b_diff = b_xi[None, :] - b_y  # [BM, BD]
                b_sgn = (b_diff > 0).to(tl.float32) - (b_diff < 0).to(tl.float32)
                b_dy += b_w[:, None] * b_sgn
            store_rows(p_dy, o_m, D, o_d, b_dy * -neg_inv_lam, m_md)
