"""Triton kernels of SEMA's windowed softmax attention; launchers in ``function.py``.

Tensors ``[B, heads, N, D]`` (unit stride on D); windows tiled from the grid's top-left corner,
their tokens in blocks of ``BLOCK``; the geometry is not specialised (one compile serves every
grid). Logits in the log2 domain, fp32 accumulation. The mean is never added here: forward
programs write value partial sums (``V_PARTIALS``), the backward adds ``g_mean / N`` to dv
(``MEAN_GRAD``). Details: docs/design/sema_kernels.md.
"""
import triton
import triton.language as tl

from .._common_kernels import bh_offset, head_dim_mask, load_rows, store_rows

_GEOMETRY = ['n_heads', 'H', 'W', 'win_h', 'win_w', 'n_win_w', 'n_win', 'n_blocks']


@triton.jit
def _window_tokens(i_w, i_blk, H, W, win_h, win_w, n_win_w, BLOCK: tl.constexpr):
    """Token indices ``o_n`` ([BLOCK], into the N = H*W grid) and validity mask ``m_n`` of the
    ``i_blk``-th block of window ``i_w``."""
    o_t = i_blk * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] token index inside the window
    o_r = (i_w // n_win_w) * win_h + o_t // win_w  # [BLOCK] grid row
    o_c = (i_w % n_win_w) * win_w + o_t % win_w  # [BLOCK] grid column
    m_n = (o_t < win_h * win_w) & (o_r < H) & (o_c < W)  # [BLOCK]
    o_n = o_r * W + o_c  # [BLOCK]
    return o_n, m_n


@triton.jit
def _program(n_win, n_blocks):
    """``(i_blk, i_w, i_bh)``: block (fastest), window and batch*head of this program."""
    i_prog = tl.program_id(0)
    return i_prog % n_blocks, (i_prog // n_blocks) % n_win, i_prog // (n_blocks * n_win)


@triton.jit
def _slices(q, k, v, x, i_bh, n_heads, stride_qb, stride_qh, stride_kb, stride_kh,
            stride_vb, stride_vh, stride_xb, stride_xh):
    """q, k, v and x (o, or dO in the backward) moved to the (batch, head) slice ``i_bh`` (the
    gradients' pointers are moved just before their stores: fewer live 64-bit values)."""
    return (q + bh_offset(i_bh, n_heads, stride_qb, stride_qh),
            k + bh_offset(i_bh, n_heads, stride_kb, stride_kh),
            v + bh_offset(i_bh, n_heads, stride_vb, stride_vh),
            x + bh_offset(i_bh, n_heads, stride_xb, stride_xh))


@triton.jit(do_not_specialize=_GEOMETRY[:-1])
def sema_fwd_window_kernel(
    q, k, v, o, v_sum,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    n_heads, H, W, win_h, win_w, n_win_w, n_win, scale, D,
    BD: tl.constexpr, EVEN_D: tl.constexpr, BLOCK: tl.constexpr, V_PARTIALS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Forward, one program per (batch*head, window) whose window fits one block:
    o = softmax(q k^T * scale) v; v_sum ``[B*heads, n_win, D]`` (V_PARTIALS)."""
    _, i_w, i_bh = _program(n_win, 1)
    q, k, v, o = _slices(q, k, v, o, i_bh, n_heads, stride_qb, stride_qh, stride_kb, stride_kh,
                         stride_vb, stride_vh, stride_ob, stride_oh)

    o_d, m_d = head_dim_mask(D, BD, EVEN_D)  # [BD]
    o_n, m_n = _window_tokens(i_w, 0, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
    m_nd = m_n[:, None] & m_d[None, :]  # [BLOCK, BD]
    b_q = load_rows(q, o_n, stride_qn, o_d, m_nd)  # [BLOCK, BD]
    b_k = load_rows(k, o_n, stride_kn, o_d, m_nd)  # [BLOCK, BD]
    b_v = load_rows(v, o_n, stride_vn, o_d, m_nd)  # [BLOCK, BD]
    if V_PARTIALS:
        # this window's share of the value mean (padded rows were loaded as 0), summed before
        # the logits exist, when the fewest registers are live
        tl.store(v_sum + tl.program_id(0).to(tl.int64) * D + o_d,
                 tl.sum(b_v.to(tl.float32), 0) / (H * W), mask=m_d)

    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * (scale * 1.4426950408889634)
    b_s = tl.where(m_n[None, :], b_s, float('-inf'))  # [BLOCK, BLOCK] padded keys excluded
    b_p = tl.exp2(b_s - tl.max(b_s, 1)[:, None])  # [BLOCK, BLOCK]
    b_o = tl.dot(b_p.to(b_v.dtype), b_v, input_precision=INPUT_PRECISION)  # [BLOCK, BD]
    b_o = b_o / tl.sum(b_p, 1)[:, None]
    store_rows(o, o_n, stride_on, o_d, b_o, m_nd)


@triton.jit(do_not_specialize=_GEOMETRY)
def sema_fwd_kernel(
    q, k, v, o, lse, v_sum,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    n_heads, H, W, win_h, win_w, n_win_w, n_win, n_blocks, scale, D,
    BD: tl.constexpr, EVEN_D: tl.constexpr, BLOCK: tl.constexpr, V_PARTIALS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Forward, one program per (batch*head, window, query block), online softmax over the
    window's key blocks; lse ``[B*heads, N]`` fp32 (log2) for the backward; v_sum
    ``[B*heads, n_win * n_blocks, D]`` (V_PARTIALS)."""
    i_blk, i_w, i_bh = _program(n_win, n_blocks)
    q, k, v, o = _slices(q, k, v, o, i_bh, n_heads, stride_qb, stride_qh, stride_kb, stride_kh,
                         stride_vb, stride_vh, stride_ob, stride_oh)

    o_d, m_d = head_dim_mask(D, BD, EVEN_D)  # [BD]
    o_nq, m_nq = _window_tokens(i_w, i_blk, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
    m_q = m_nq[:, None] & m_d[None, :]  # [BLOCK, BD]
    b_q = load_rows(q, o_nq, stride_qn, o_d, m_q)  # [BLOCK, BD]
    if V_PARTIALS:
        # the value rows of this program's own block (the loop below reads them again, from
        # L2): each block of each window is summed by exactly one program
        b_v = load_rows(v, o_nq, stride_vn, o_d, m_q)  # [BLOCK, BD]
        tl.store(v_sum + tl.program_id(0).to(tl.int64) * D + o_d,
                 tl.sum(b_v.to(tl.float32), 0) / (H * W), mask=m_d)

    qk_scale = scale * 1.4426950408889634
    b_m = tl.full([BLOCK], float('-inf'), dtype=tl.float32)  # [BLOCK] running row max (log2)
    b_l = tl.zeros([BLOCK], dtype=tl.float32)  # [BLOCK] running row sum
    b_acc = tl.zeros([BLOCK, BD], dtype=tl.float32)  # [BLOCK, BD]
    # Block 0 always holds the window's top-left token, which is always real, so b_m is finite
    # after the first iteration and fully padded later blocks contribute exp2(-inf) = 0.
    for i_kb in range(n_blocks):
        o_nk, m_nk = _window_tokens(i_w, i_kb, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
        m_kv = m_nk[:, None] & m_d[None, :]  # [BLOCK, BD]
        b_k = load_rows(k, o_nk, stride_kn, o_d, m_kv)
        b_v = load_rows(v, o_nk, stride_vn, o_d, m_kv)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * qk_scale
        b_s = tl.where(m_nk[None, :], b_s, float('-inf'))  # [BLOCK, BLOCK]
        b_m_new = tl.maximum(b_m, tl.max(b_s, 1))  # [BLOCK]
        b_alpha = tl.exp2(b_m - b_m_new)  # [BLOCK]
        b_p = tl.exp2(b_s - b_m_new[:, None])  # [BLOCK, BLOCK]
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v,
                                                  input_precision=INPUT_PRECISION)
        b_m = b_m_new

    b_o = b_acc / b_l[:, None]  # [BLOCK, BD]
    store_rows(o, o_nq, stride_on, o_d, b_o, m_q)
    tl.store(lse + i_bh.to(tl.int64) * (H * W) + o_nq, b_m + tl.log2(b_l), mask=m_nq)


@triton.jit(do_not_specialize=_GEOMETRY[:-1])
def sema_bwd_window_kernel(
    q, k, v, do, dq, dk, dv, g_mean,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_don,
    stride_gb, stride_gh, stride_gn,
    stride_dvb, stride_dvh, stride_dvn,
    n_heads, H, W, win_h, win_w, n_win_w, n_win, scale, D,
    BD: tl.constexpr, EVEN_D: tl.constexpr, BLOCK: tl.constexpr, MEAN_GRAD: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Backward, one program per (batch*head, window) whose window fits one block: recomputes
    the softmax and takes ``delta_i = sum_j P_ij dP_ij``, so it needs neither o nor lse. dq and
    dk share the strides ``stride_g*``; g_mean ``[B*heads, D]`` (any float dtype, MEAN_GRAD)."""
    _, i_w, i_bh = _program(n_win, 1)
    q, k, v, do = _slices(q, k, v, do, i_bh, n_heads, stride_qb, stride_qh, stride_kb,
                          stride_kh, stride_vb, stride_vh, stride_dob, stride_doh)

    o_d, m_d = head_dim_mask(D, BD, EVEN_D)  # [BD]
    o_n, m_n = _window_tokens(i_w, 0, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
    m_nd = m_n[:, None] & m_d[None, :]  # [BLOCK, BD]
    b_q = load_rows(q, o_n, stride_qn, o_d, m_nd)  # [BLOCK, BD]
    b_k = load_rows(k, o_n, stride_kn, o_d, m_nd)  # [BLOCK, BD]
    b_v = load_rows(v, o_n, stride_vn, o_d, m_nd)  # [BLOCK, BD]
    b_do = load_rows(do, o_n, stride_don, o_d, m_nd)

    # P: queries on rows, keys on columns. Padded query rows have q = dO = 0, so their dS = 0.
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * (scale * 1.4426950408889634)
    b_s = tl.where(m_n[None, :], b_s, float('-inf'))  # [BLOCK, BLOCK]
    b_p = tl.exp2(b_s - tl.max(b_s, 1)[:, None])  # [BLOCK, BLOCK]
    b_p = b_p / tl.sum(b_p, 1)[:, None]

    # dP first: v and then dO die before dS (at BD = 64, 64-token windows the kernel is at the
    # register limit on sm_80)
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=INPUT_PRECISION)  # [BLOCK, BLOCK]
    b_dv = tl.dot(tl.trans(b_p.to(b_do.dtype)), b_do,
                  input_precision=INPUT_PRECISION)  # [BLOCK, BD]
    if MEAN_GRAD:
        b_dv += (tl.load(g_mean + i_bh * D + o_d, mask=m_d, other=0.).to(tl.float32)
                 / (H * W))[None, :]
    store_rows(dv + bh_offset(i_bh, n_heads, stride_dvb, stride_dvh), o_n, stride_dvn, o_d,
               b_dv, m_nd)

    b_delta = tl.sum(b_p * b_dp, 1)  # [BLOCK]
    b_ds = (b_p * (b_dp - b_delta[:, None])).to(b_q.dtype)  # [BLOCK, BLOCK]
    b_dk = tl.dot(tl.trans(b_ds), b_q, input_precision=INPUT_PRECISION) * scale  # [BLOCK, BD]
    store_rows(dk + bh_offset(i_bh, n_heads, stride_gb, stride_gh), o_n, stride_gn, o_d, b_dk,
               m_nd)
    b_dq = tl.dot(b_ds, b_k, input_precision=INPUT_PRECISION) * scale  # [BLOCK, BD]
    store_rows(dq + bh_offset(i_bh, n_heads, stride_gb, stride_gh), o_n, stride_gn, o_d, b_dq,
               m_nd)


@triton.jit(do_not_specialize=_GEOMETRY)
def sema_bwd_kernel(
    q, k, v, do, dq, dk, dv, lse, delta, g_mean,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_don,
    stride_gb, stride_gh, stride_gn,
    stride_dvb, stride_dvh, stride_dvn,
    n_heads, H, W, win_h, win_w, n_win_w, n_win, n_blocks, scale, D,
    BD: tl.constexpr, EVEN_D: tl.constexpr, BLOCK: tl.constexpr, MEAN_GRAD: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Backward, one program per (batch*head, window, block j): dk_j, dv_j over the window's
    query blocks, then dq_j over its key blocks, from the forward's lse and the pre-pass's
    delta (``[B*heads, N]`` fp32); g_mean as in :func:`sema_bwd_window_kernel`."""
    i_blk, i_w, i_bh = _program(n_win, n_blocks)
    q, k, v, do = _slices(q, k, v, do, i_bh, n_heads, stride_qb, stride_qh, stride_kb,
                          stride_kh, stride_vb, stride_vh, stride_dob, stride_doh)
    lse += i_bh.to(tl.int64) * (H * W)
    delta += i_bh.to(tl.int64) * (H * W)
    qk_scale = scale * 1.4426950408889634

    o_d, m_d = head_dim_mask(D, BD, EVEN_D)  # [BD]
    o_nj, m_nj = _window_tokens(i_w, i_blk, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
    m_j = m_nj[:, None] & m_d[None, :]  # [BLOCK, BD]

    # ---- part 1: dk, dv of key block j (keys on the rows of S^T: [keys, queries]) ----
    b_k = load_rows(k, o_nj, stride_kn, o_d, m_j)  # [BLOCK, BD]
    b_v = load_rows(v, o_nj, stride_vn, o_d, m_j)  # [BLOCK, BD]
    b_dk = tl.zeros([BLOCK, BD], dtype=tl.float32)
    b_dv = tl.zeros([BLOCK, BD], dtype=tl.float32)
    for i_qb in range(n_blocks):
        o_ni, m_ni = _window_tokens(i_w, i_qb, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
        m_i = m_ni[:, None] & m_d[None, :]  # [BLOCK, BD]
        b_q = load_rows(q, o_ni, stride_qn, o_d, m_i)
        b_do = load_rows(do, o_ni, stride_don, o_d, m_i)
        # padded queries have q = dO = 0 (and lse = delta = 0): they add nothing to dk, dv
        b_lse = tl.load(lse + o_ni, mask=m_ni, other=0.)  # [BLOCK]
        b_delta = tl.load(delta + o_ni, mask=m_ni, other=0.)  # [BLOCK]
        b_st = tl.dot(b_k, tl.trans(b_q), input_precision=INPUT_PRECISION) * qk_scale
        # padded keys: P = 0 (their logit 0 - lse could overflow exp2 when every real logit of a
        # row is very negative)
        b_pt = tl.where(m_nj[:, None], tl.exp2(b_st - b_lse[None, :]), 0.)
        b_dv += tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=INPUT_PRECISION)
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=INPUT_PRECISION)  # [BLOCK(k), BLOCK(q)]
        b_dst = b_pt * (b_dpt - b_delta[None, :])  # [BLOCK(k), BLOCK(q)]
        b_dk += tl.dot(b_dst.to(b_q.dtype), b_q, input_precision=INPUT_PRECISION)
    if MEAN_GRAD:
        b_dv += (tl.load(g_mean + i_bh * D + o_d, mask=m_d, other=0.).to(tl.float32)
                 / (H * W))[None, :]
    store_rows(dv + bh_offset(i_bh, n_heads, stride_dvb, stride_dvh), o_nj, stride_dvn, o_d,
               b_dv, m_j)
    store_rows(dk + bh_offset(i_bh, n_heads, stride_gb, stride_gh), o_nj, stride_gn, o_d,
               b_dk * scale, m_j)

    # ---- part 2: dq of query block j ----
    b_q = load_rows(q, o_nj, stride_qn, o_d, m_j)  # [BLOCK, BD]
    b_do = load_rows(do, o_nj, stride_don, o_d, m_j)
    b_lse = tl.load(lse + o_nj, mask=m_nj, other=0.)  # [BLOCK]
    b_delta = tl.load(delta + o_nj, mask=m_nj, other=0.)  # [BLOCK]
    b_dq = tl.zeros([BLOCK, BD], dtype=tl.float32)
    for i_kb in range(n_blocks):
        o_ni, m_ni = _window_tokens(i_w, i_kb, H, W, win_h, win_w, n_win_w, BLOCK)  # [BLOCK]
        m_i = m_ni[:, None] & m_d[None, :]  # [BLOCK, BD]
        b_k = load_rows(k, o_ni, stride_kn, o_d, m_i)
        b_v = load_rows(v, o_ni, stride_vn, o_d, m_i)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * qk_scale
        b_p = tl.where(m_ni[None, :], tl.exp2(b_s - b_lse[:, None]), 0.)  # padded keys: P = 0
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=INPUT_PRECISION)  # [BLOCK(q), BLOCK(k)]
        b_ds = b_p * (b_dp - b_delta[:, None])  # [BLOCK(q), BLOCK(k)]
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=INPUT_PRECISION)
    store_rows(dq + bh_offset(i_bh, n_heads, stride_gb, stride_gh), o_nj, stride_gn, o_d,
               b_dq * scale, m_j)

