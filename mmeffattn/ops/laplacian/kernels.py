"""Triton kernels of LaplacianFormer's Laplacian kernel ``exp(-||x_i - y_j||_1 / lam)``.

Only ``@triton.jit`` functions live here; launchers and the autograd Function are in
``function.py``. Conventions shared by the kernels:

* Token tensors ``[B, heads, tokens, D]`` have arbitrary sample/head/token strides and unit
  stride on D; a program finds its ``(sample, head)`` from ``program_id(1) = b * heads + h``
  (int64 base offsets, int32 offsets inside one matrix).
* The L1 distance is not a matmul, so there is no ``tl.dot``: a tile's pairwise differences are
  a 3-D ``[rows, rows, BD]`` block reduced over D (forward) or over the other token set
  (backward), chunk by chunk, so ``[N, M, D]`` never exists outside one chunk in registers.
* All arithmetic is fp32 whatever the storage dtype: an fp16 sum of D distances overflows (and
  its exponential underflows) long before the fp32 result stops being representable.
"""
import triton
import triton.language as tl

from .._common_kernels import bh_offset, load_rows, store_rows


@triton.jit
def _tile(n_rows, n_cols, BR: tl.constexpr, BC: tl.constexpr):
    """``(o_r, m_r, o_c, m_c, i_bh)``: the row and column offsets ([BR], [BC]) and masks of
    this program's tile (``program_id(0)``, column tiles fastest) and its ``b * heads + h``
    (``program_id(1)``)."""
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
    BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
):
    """out[b, h, i, j] = exp2(-log2(e) / lam * sum_d |x_id - y_jd|) for one ``BN x BM`` tile.

    Grid: ``(cdiv(N, BN) * cdiv(M, BM), B * heads)``, tiles numbered along M fastest.
    out: ``[B, heads, N, M]`` with unit stride on M, in its own dtype.
    """
    o_n, m_n, o_m, m_m, i_bh = _tile(N, M, BN, BM)
    x += bh_offset(i_bh, heads, stride_xb, stride_xh)
    y += bh_offset(i_bh, heads, stride_yb, stride_yh)
    out += bh_offset(i_bh, heads, stride_ob, stride_oh)
    b_dist = tl.zeros([BN, BM], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)  # [BD]
        m_d = o_d < D
        # padded D columns load 0 on both sides and add |0 - 0| = 0
        b_x = load_rows(x, o_n, stride_xn, o_d, m_n[:, None] & m_d[None, :]).to(tl.float32)
        b_y = load_rows(y, o_m, stride_yn, o_d, m_m[:, None] & m_d[None, :]).to(tl.float32)
        b_dist += tl.sum(tl.abs(b_x[:, None, :] - b_y[None, :, :]), 2)  # [BN, BM]
    b_out = tl.exp2(b_dist * neg_log2e_over_lam)  # [BN, BM]
    tl.store(out + o_n[:, None] * stride_on + o_m[None, :], b_out.to(out.dtype.element_ty),
             mask=m_n[:, None] & m_m[None, :])


@triton.jit
def laplacian_bwd_kernel(
    x, y, g, out, dx,
    stride_xb, stride_xh, stride_xn,
    stride_yb, stride_yh, stride_yn,
    stride_gb, stride_gh, stride_gn, stride_gm,
    stride_ob, stride_oh, stride_on, stride_om,
    stride_db, stride_dh, stride_dn,
    heads, N, M, D, neg_inv_lam,
    BN: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
):
    """dx[i, d] = -1/lam * sum_j g_ij out_ij sign(x_id - y_jd) for a ``BN x BD`` tile of dx.

    The same kernel gives dy with the roles swapped (x <-> y, and g, out transposed by swapping
    their strides): ``dy[j, d] = -1/lam * sum_i g_ij out_ij sign(y_jd - x_id)``.
    Grid: ``(cdiv(N, BN) * cdiv(D, BD), B * heads)``, tiles numbered along D fastest.
    g, out: ``[B, heads, N, M]`` (any strides); dx: x's shape, unit stride on D.
    """
    o_n, m_n, o_d, m_d, i_bh = _tile(N, D, BN, BD)
    x += bh_offset(i_bh, heads, stride_xb, stride_xh)
    y += bh_offset(i_bh, heads, stride_yb, stride_yh)
    g += bh_offset(i_bh, heads, stride_gb, stride_gh)
    out += bh_offset(i_bh, heads, stride_ob, stride_oh)
    dx += bh_offset(i_bh, heads, stride_db, stride_dh)
    b_x = load_rows(x, o_n, stride_xn, o_d, m_n[:, None] & m_d[None, :]).to(tl.float32)
    b_dx = tl.zeros([BN, BD], dtype=tl.float32)
    for m0 in range(0, M, BM):
        o_m = m0 + tl.arange(0, BM)  # [BM]
        m_m = o_m < M
        m_nm = m_n[:, None] & m_m[None, :]  # [BN, BM]
        # w = g * out, zero on padded pairs, so they add nothing whatever their sign
        b_w = tl.load(g + o_n[:, None] * stride_gn + o_m[None, :] * stride_gm, mask=m_nm,
                      other=0.).to(tl.float32)  # [BN, BM]
        b_w *= tl.load(out + o_n[:, None] * stride_on + o_m[None, :] * stride_om, mask=m_nm,
                       other=0.).to(tl.float32)
        b_y = load_rows(y, o_m, stride_yn, o_d, m_m[:, None] & m_d[None, :]).to(tl.float32)
        b_diff = b_x[:, None, :] - b_y[None, :, :]  # [BN, BM, BD]
        # sign with sign(0) = 0 (torch.sign / cdist's convention)
        b_sgn = (b_diff > 0).to(tl.float32) - (b_diff < 0).to(tl.float32)  # [BN, BM, BD]
        b_dx += tl.sum(b_w[:, :, None] * b_sgn, 1)  # [BN, BD]
    store_rows(dx, o_n, stride_dn, o_d, b_dx * neg_inv_lam, m_n[:, None] & m_d[None, :])
