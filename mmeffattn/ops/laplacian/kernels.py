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
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // heads, i_bh % heads
    n_tiles_m = tl.cdiv(M, BM)
    i_n, i_m = i_t // n_tiles_m, i_t % n_tiles_m
    x += i_b * stride_xb + i_h * stride_xh
    y += i_b * stride_yb + i_h * stride_yh
    out += i_b * stride_ob + i_h * stride_oh

    o_n = i_n * BN + tl.arange(0, BN)  # [BN]
    o_m = i_m * BM + tl.arange(0, BM)  # [BM]
    m_n, m_m = o_n < N, o_m < M
    b_dist = tl.zeros([BN, BM], dtype=tl.float32)
    for d0 in range(0, D, BD):
        o_d = d0 + tl.arange(0, BD)  # [BD]
        m_d = o_d < D
        # padded D columns load 0 on both sides and add |0 - 0| = 0
        b_x = tl.load(x + o_n[:, None] * stride_xn + o_d[None, :],
                      mask=m_n[:, None] & m_d[None, :], other=0.).to(tl.float32)  # [BN, BD]
        b_y = tl.load(y + o_m[:, None] * stride_yn + o_d[None, :],
                      mask=m_m[:, None] & m_d[None, :], other=0.).to(tl.float32)  # [BM, BD]
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
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // heads, i_bh % heads
    n_tiles_d = tl.cdiv(D, BD)
    i_n, i_d = i_t // n_tiles_d, i_t % n_tiles_d
    x += i_b * stride_xb + i_h * stride_xh
    y += i_b * stride_yb + i_h * stride_yh
    g += i_b * stride_gb + i_h * stride_gh
    out += i_b * stride_ob + i_h * stride_oh
    dx += i_b * stride_db + i_h * stride_dh

    o_n = i_n * BN + tl.arange(0, BN)  # [BN]
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_n, m_d = o_n < N, o_d < D
    b_x = tl.load(x + o_n[:, None] * stride_xn + o_d[None, :],
                  mask=m_n[:, None] & m_d[None, :], other=0.).to(tl.float32)  # [BN, BD]
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
        b_y = tl.load(y + o_m[:, None] * stride_yn + o_d[None, :],
                      mask=m_m[:, None] & m_d[None, :], other=0.).to(tl.float32)  # [BM, BD]
        b_diff = b_x[:, None, :] - b_y[None, :, :]  # [BN, BM, BD]
        # sign with sign(0) = 0 (torch.sign / cdist's convention)
        b_sgn = (b_diff > 0).to(tl.float32) - (b_diff < 0).to(tl.float32)  # [BN, BM, BD]
        b_dx += tl.sum(b_w[:, :, None] * b_sgn, 1)  # [BN, BD]
    tl.store(dx + o_n[:, None] * stride_dn + o_d[None, :], (b_dx * neg_inv_lam).to(
        dx.dtype.element_ty), mask=m_n[:, None] & m_d[None, :])
