"""Triton kernels of core-periphery attention (VECA); launchers in ``function.py``.

Each kernel runs a range of query rows against a range of key rows (core queries against all
keys, patch queries against the core keys); with ``ROPE`` q/k tiles are rotated on load and
gradients mapped back in the epilogues. Layouts and rope details: docs/design/ops_kernels.md.
"""
import triton
import triton.language as tl

from .._common_kernels import head_dim_mask as _head_dim_mask

#: sizes not specialised: one compiled kernel serves every C and N of a tile class
_SIZES = ['n_heads', 'n_q', 'n_k', 'n_blocks', 'n_splits', 'blocks_per_split', 'o_row0']


@triton.jit
def _halves(x):
    """The even and the odd channels of a ``[rows, BD]`` tile, each ``[rows, BD/2]``."""
    return tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))


@triton.jit
def _interleave(a, b):
    """Inverse of :func:`_halves`: ``[rows, BD]`` with ``a`` on the even channels."""
    return tl.reshape(tl.join(a, b), [a.shape[0], 2 * a.shape[1]])


@triton.jit
def _head_dim_mask_rope(D, BD: tl.constexpr, EVEN_D: tl.constexpr, ROPE: tl.constexpr):
    """``head_dim_mask``, per channel pair under rope, so a thread loads both channels of a
    pair (a per-channel mask made the loads scalar and spilled)."""
    if ROPE and not EVEN_D:
        o_d = tl.arange(0, BD)
        return o_d, (o_d // 2) < (D // 2)
    else:
        return _head_dim_mask(D, BD, EVEN_D)


@triton.jit
def _rows(x, o_t, stride_xn, ROPE: tl.constexpr, EVEN_D: tl.constexpr):
    """Pointers to rows ``o_t`` of x; with rope and D < BD declared pair-aligned (the
    launchers ensure it) so that a channel pair is one load."""
    p = x + o_t * stride_xn
    if ROPE:
        if not EVEN_D:
            p = tl.multiple_of(p, x.dtype.element_ty.primitive_bitwidth // 4)
    return p


@triton.jit
def _load_rows(x, o_t, m_t, stride_xn, cos, sin, stride_rn, o_d, m_d, ROPE: tl.constexpr,
               EVEN_D: tl.constexpr):
    """Load the ``[len(o_t), BD]`` tile of rows ``o_t`` of x (zero where masked), rotated by the
    rope tables when ``ROPE``; returned in x's dtype."""
    m_x = m_t[:, None] & m_d[None, :]  # [BT, BD]
    p_x = _rows(x, o_t, stride_xn, ROPE, EVEN_D)[:, None] + o_d[None, :]
    b_x = tl.load(p_x, mask=m_x, other=0.)
    if ROPE:
        x_e, x_o = _halves(b_x.to(tl.float32))
        p_c = _rows(cos, o_t, stride_rn, ROPE, EVEN_D)[:, None] + o_d[None, :]
        p_s = _rows(sin, o_t, stride_rn, ROPE, EVEN_D)[:, None] + o_d[None, :]
        c_e, c_o = _halves(tl.load(p_c, mask=m_x, other=0.).to(tl.float32))
        s_e, s_o = _halves(tl.load(p_s, mask=m_x, other=0.).to(tl.float32))
        # rotate_pairs(x)[2i] = -x[2i+1], [2i+1] = x[2i]. The (no-op) row mask keeps the
        # compiler from hoisting the mma layout conversion to the loads (spills on sm_80).
        m_h = m_t[:, None]
        dt = x.dtype.element_ty
        b_x = _interleave(tl.where(m_h, x_e * c_e - x_o * s_e, 0.).to(dt),
                          tl.where(m_h, x_o * c_o + x_e * s_o, 0.).to(dt))
    return b_x


@triton.jit
def _store_rows_grad(b_g, x, o_t, m_t, stride_xn, cos, sin, stride_rn, o_d, m_d,
                     dx, o_r, stride_gn, dtab, stride_tk, stride_tn,
                     ROPE: tl.constexpr, ROPE_GRAD: tl.constexpr, EVEN_D: tl.constexpr):
    """Store gradient ``b_g`` of rows ``o_t`` at rows ``o_r`` of dx. With ``ROPE``, b_g is of
    ``x cos + R x sin``: store ``g cos - R(g sin)`` (and, ``ROPE_GRAD``, ``g x``, ``g R x``)."""
    m_x = m_t[:, None] & m_d[None, :]  # [BT, BD]
    p_g = _rows(dx, o_r, stride_gn, ROPE, EVEN_D)[:, None] + o_d[None, :]
    if ROPE:
        g_e, g_o = _halves(b_g)
        p_c = _rows(cos, o_t, stride_rn, ROPE, EVEN_D)[:, None] + o_d[None, :]
        p_s = _rows(sin, o_t, stride_rn, ROPE, EVEN_D)[:, None] + o_d[None, :]
        c_e, c_o = _halves(tl.load(p_c, mask=m_x, other=0.).to(tl.float32))
        s_e, s_o = _halves(tl.load(p_s, mask=m_x, other=0.).to(tl.float32))
        # x_rot[2i] = x[2i] c[2i] - x[2i+1] s[2i], x_rot[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]
        b_dx = _interleave(g_e * c_e + g_o * s_o, g_o * c_o - g_e * s_e)
        tl.store(p_g, b_dx.to(dx.dtype.element_ty), mask=m_x)
        if ROPE_GRAD:
            p_x = _rows(x, o_t, stride_xn, ROPE, EVEN_D)[:, None] + o_d[None, :]
            b_x = tl.load(p_x, mask=m_x, other=0.)
            x_e, x_o = _halves(b_x.to(tl.float32))
            o_p = _rows(dtab, o_r, stride_tn, ROPE, EVEN_D)[:, None] + o_d[None, :]
            tl.store(o_p, _interleave(g_e * x_e, g_o * x_o), mask=m_x)
            tl.store(o_p + stride_tk, _interleave(-g_e * x_o, g_o * x_e), mask=m_x)
    else:
        tl.store(p_g, b_g.to(dx.dtype.element_ty), mask=m_x)


@triton.jit
def _split_range(i_s, blocks_per_split, n_rows, BLOCK: tl.constexpr):
    """Blocks ``[start, end)`` of the long loop handled by split ``i_s``."""
    start = i_s * blocks_per_split
    return start, tl.minimum(start + blocks_per_split, tl.cdiv(n_rows, BLOCK))


@triton.jit
def _program(n_blocks, n_splits, n_heads):
    """``(i_blk, i_s, i_bh, i_b, i_h)``: row block (fastest), split, batch*head, b, h."""
    i_prog = tl.program_id(0)
    i_bh = i_prog // (n_blocks * n_splits)
    return (i_prog % n_blocks, (i_prog // n_blocks) % n_splits, i_bh,
            (i_bh // n_heads).to(tl.int64), (i_bh % n_heads).to(tl.int64))


@triton.jit
def _bwd_inputs(q, k, v, do, cos, sin, lse, delta, stride_qb, stride_qh, stride_kb, stride_kh,
                stride_vb, stride_vh, stride_dob, stride_doh, stride_rb, L, i_bh, i_b, i_h):
    """The backward kernels' inputs offset to batch ``i_b``, head ``i_h``."""
    return (q + i_b * stride_qb + i_h * stride_qh, k + i_b * stride_kb + i_h * stride_kh,
            v + i_b * stride_vb + i_h * stride_vh, do + i_b * stride_dob + i_h * stride_doh,
            cos + i_b * stride_rb, sin + i_b * stride_rb, lse + i_bh.to(tl.int64) * L,
            delta + i_bh.to(tl.int64) * L)


@triton.jit(do_not_specialize=_SIZES + ['q_start'])
def core_periphery_fwd_kernel(
    q, k, v, cos, sin, o, lse,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_rb, stride_rn,
    stride_os, stride_obh, stride_on,
    stride_ls, stride_lbh,
    n_heads, q_start, n_q, n_k, n_blocks, n_splits, blocks_per_split, o_row0, scale, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, EVEN_D: tl.constexpr,
    ROPE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Softmax attention of queries ``[q_start, q_start + n_q)`` over keys ``[0, n_k)``
    (online softmax over split ``i_s``'s key blocks); o and lse at row ``o_row0 + i``."""
    i_m, i_s, i_bh, i_b, i_h = _program(n_blocks, n_splits, n_heads)
    q += i_b * stride_qb + i_h * stride_qh
    k += i_b * stride_kb + i_h * stride_kh
    v += i_b * stride_vb + i_h * stride_vh
    cos += i_b * stride_rb
    sin += i_b * stride_rb
    o += i_s.to(tl.int64) * stride_os + i_bh.to(tl.int64) * stride_obh
    lse += i_s.to(tl.int64) * stride_ls + i_bh.to(tl.int64) * stride_lbh
    qk_scale = scale * 1.4426950408889634

    o_d, m_d = _head_dim_mask_rope(D, BD, EVEN_D, ROPE)  # [BD]
    o_i = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query index inside the range
    m_i = o_i < n_q
    b_q = _load_rows(q, q_start + o_i, m_i, stride_qn, cos, sin, stride_rn, o_d, m_d, ROPE,
                     EVEN_D)

    b_acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    b_m = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)  # running max (log2 domain)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2
    kb_start, kb_end = _split_range(i_s, blocks_per_split, n_k, BLOCK_N)
    for i_kb in range(kb_start, kb_end):
        o_j = i_kb * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key index
        m_j = o_j < n_k
        b_k = _load_rows(k, o_j, m_j, stride_kn, cos, sin, stride_rn, o_d, m_d, ROPE, EVEN_D)
        b_v = tl.load(v + o_j[:, None] * stride_vn + o_d[None, :],
                      mask=m_j[:, None] & m_d[None, :], other=0.)  # [BLOCK_N, BD]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * qk_scale
        b_s = tl.where(m_j[None, :], b_s, float('-inf'))  # [BLOCK_M, BLOCK_N]
        # every split holds at least one real key, so b_m_new is finite from the first block on
        b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v,
                                                  input_precision=INPUT_PRECISION)
        b_m = b_m_new
    b_acc = b_acc / b_l[:, None]
    o_r = o_row0 + o_i  # [BLOCK_M] output rows
    tl.store(o + o_r[:, None] * stride_on + o_d[None, :], b_acc.to(o.dtype.element_ty),
             mask=m_i[:, None] & m_d[None, :])
    tl.store(lse + o_r, b_m + tl.log2(b_l), mask=m_i)


@triton.jit(do_not_specialize=_SIZES + ['q_start', 'L'])
def core_periphery_bwd_dq_kernel(
    q, k, v, cos, sin, do, lse, delta, dq, dtab, acc,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_rb, stride_rn,
    stride_dob, stride_doh, stride_don,
    stride_gs, stride_gbh, stride_gn,
    stride_ts, stride_tbh, stride_tk, stride_tn,
    stride_ap, stride_abh, stride_an,
    n_heads, q_start, n_q, n_k, n_blocks, n_splits, blocks_per_split, o_row0, L, scale, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, EVEN_D: tl.constexpr,
    ROPE: tl.constexpr, ROPE_GRAD: tl.constexpr, KV_ATOMIC: tl.constexpr,
    ACC_INIT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """dq = scale * dS K for queries ``[q_start, q_start + n_q)`` over keys ``[0, n_k)``.

    ``KV_ATOMIC``: also add these queries' share of the keys' dk (``dS^T Q``) and dv
    (``P^T dO``) to the fp32 planes ``acc``, ``acc + stride_ap`` with atomics.
    ``ACC_INIT``: add the dq sums in ``acc`` before the epilogue (``n_k = 0``).
    """
    i_m, i_s, i_bh, i_b, i_h = _program(n_blocks, n_splits, n_heads)
    q, k, v, do, cos, sin, lse, delta = _bwd_inputs(
        q, k, v, do, cos, sin, lse, delta, stride_qb, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_dob, stride_doh, stride_rb, L, i_bh, i_b, i_h)
    dq += i_s.to(tl.int64) * stride_gs + i_bh.to(tl.int64) * stride_gbh
    dtab += i_s.to(tl.int64) * stride_ts + i_bh.to(tl.int64) * stride_tbh
    acc += i_bh.to(tl.int64) * stride_abh
    qk_scale = scale * 1.4426950408889634

    o_d, m_d = _head_dim_mask_rope(D, BD, EVEN_D, ROPE)  # [BD]
    o_i = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query index inside the range
    m_i = o_i < n_q
    o_t = q_start + o_i  # [BLOCK_M] token rows
    b_q = _load_rows(q, o_t, m_i, stride_qn, cos, sin, stride_rn, o_d, m_d, ROPE, EVEN_D)
    b_do = tl.load(do + o_t[:, None] * stride_don + o_d[None, :],
                   mask=m_i[:, None] & m_d[None, :], other=0.)
    b_lse = tl.load(lse + o_t, mask=m_i, other=0.)  # [BLOCK_M]
    b_delta = tl.load(delta + o_t, mask=m_i, other=0.)  # [BLOCK_M]

    b_dq = tl.zeros([BLOCK_M, BD], dtype=tl.float32)  # of the rotated q with rope
    kb_start, kb_end = _split_range(i_s, blocks_per_split, n_k, BLOCK_N)
    for i_kb in range(kb_start, kb_end):
        o_j = i_kb * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key index
        m_j = o_j < n_k
        m_jd = m_j[:, None] & m_d[None, :]
        b_k = _load_rows(k, o_j, m_j, stride_kn, cos, sin, stride_rn, o_d, m_d, ROPE, EVEN_D)
        b_v = tl.load(v + o_j[:, None] * stride_vn + o_d[None, :], mask=m_jd, other=0.)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * qk_scale
        # P = 0 for padded keys (0 - lse could overflow exp2); with KV_ATOMIC padded queries too
        if KV_ATOMIC:
            m_p = m_i[:, None] & m_j[None, :]
        else:
            m_p = m_j[None, :]
        b_p = tl.where(m_p, tl.exp2(b_s - b_lse[:, None]), 0.)  # [BLOCK_M, BLOCK_N]
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=INPUT_PRECISION)
        b_ds = b_p * (b_dp - b_delta[:, None])  # [BLOCK_M, BLOCK_N]
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=INPUT_PRECISION)
        if KV_ATOMIC:  # this block's share of the keys' gradients, [BLOCK_N, BD] each
            b_dv = tl.dot(tl.trans(b_p.to(b_do.dtype)), b_do, input_precision=INPUT_PRECISION)
            b_dk = tl.dot(tl.trans(b_ds.to(b_q.dtype)), b_q, input_precision=INPUT_PRECISION)
            p_a = acc + o_j[:, None] * stride_an + o_d[None, :]
            tl.atomic_add(p_a, b_dk, mask=m_jd, sem='relaxed')
            tl.atomic_add(p_a + stride_ap, b_dv, mask=m_jd, sem='relaxed')
    if ACC_INIT:
        b_dq += tl.load(acc + o_i[:, None] * stride_an + o_d[None, :],
                        mask=m_i[:, None] & m_d[None, :], other=0.)
    _store_rows_grad(b_dq * scale, q, o_t, m_i, stride_qn, cos, sin, stride_rn,
                     o_d, m_d, dq, o_row0 + o_i, stride_gn, dtab, stride_tk, stride_tn,
                     ROPE, ROPE_GRAD, EVEN_D)


@triton.jit(do_not_specialize=_SIZES + ['k_start', 'L'])
def core_periphery_bwd_dkdv_kernel(
    q, k, v, cos, sin, do, lse, delta, dk, dv, dtab, acc,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_rb, stride_rn,
    stride_dob, stride_doh, stride_don,
    stride_gs, stride_gbh, stride_gn,
    stride_ts, stride_tbh, stride_tk, stride_tn,
    stride_ap, stride_abh, stride_an,
    n_heads, k_start, n_k, n_q, n_blocks, n_splits, blocks_per_split, o_row0, L, scale, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BD: tl.constexpr, EVEN_D: tl.constexpr,
    ROPE: tl.constexpr, ROPE_GRAD: tl.constexpr, ACC_INIT: tl.constexpr,
    Q_ATOMIC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """dv = P^T dO, dk = scale * dS^T Q for keys ``[k_start, k_start + n_k)`` from queries
    ``[0, n_q)`` (exactly the queries that attend them).

    ``ACC_INIT``: add the other queries' share summed by the ``KV_ATOMIC`` dq kernel.
    ``Q_ATOMIC``: also add the queries' ``dS K`` to the third ``acc`` plane with atomics.
    """
    i_n, i_s, i_bh, i_b, i_h = _program(n_blocks, n_splits, n_heads)
    q, k, v, do, cos, sin, lse, delta = _bwd_inputs(
        q, k, v, do, cos, sin, lse, delta, stride_qb, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_dob, stride_doh, stride_rb, L, i_bh, i_b, i_h)
    g_off = i_s.to(tl.int64) * stride_gs + i_bh.to(tl.int64) * stride_gbh
    dk += g_off
    dv += g_off
    dtab += i_s.to(tl.int64) * stride_ts + i_bh.to(tl.int64) * stride_tbh
    acc += i_bh.to(tl.int64) * stride_abh
    qk_scale = scale * 1.4426950408889634

    o_d, m_d = _head_dim_mask_rope(D, BD, EVEN_D, ROPE)  # [BD]
    o_j = i_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key index inside the range
    m_j = o_j < n_k
    o_t = k_start + o_j  # [BLOCK_N] token rows
    m_jd = m_j[:, None] & m_d[None, :]
    b_k = _load_rows(k, o_t, m_j, stride_kn, cos, sin, stride_rn, o_d, m_d, ROPE, EVEN_D)
    b_v = tl.load(v + o_t[:, None] * stride_vn + o_d[None, :], mask=m_jd, other=0.)

    b_dk = tl.zeros([BLOCK_N, BD], dtype=tl.float32)  # of the rotated k with rope
    b_dv = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    qb_start, qb_end = _split_range(i_s, blocks_per_split, n_q, BLOCK_M)
    for i_qb in range(qb_start, qb_end):
        o_i = i_qb * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query index
        m_i = o_i < n_q
        b_q = _load_rows(q, o_i, m_i, stride_qn, cos, sin, stride_rn, o_d, m_d, ROPE, EVEN_D)
        b_do = tl.load(do + o_i[:, None] * stride_don + o_d[None, :],
                       mask=m_i[:, None] & m_d[None, :], other=0.)
        b_lse = tl.load(lse + o_i, mask=m_i, other=0.)  # [BLOCK_M]
        b_delta = tl.load(delta + o_i, mask=m_i, other=0.)  # [BLOCK_M]
        b_st = tl.dot(b_k, tl.trans(b_q), input_precision=INPUT_PRECISION) * qk_scale
        # P^T = 0 for padded keys and queries past the range
        b_pt = tl.where(m_j[:, None] & m_i[None, :], tl.exp2(b_st - b_lse[None, :]), 0.)
        b_dv += tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=INPUT_PRECISION)
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=INPUT_PRECISION)  # [BLOCK_N, BLOCK_M]
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        b_dk += tl.dot(b_dst.to(b_q.dtype), b_q, input_precision=INPUT_PRECISION)
        if Q_ATOMIC:  # this block's share of the queries' dq, [BLOCK_M, BD]
            b_dq = tl.dot(tl.trans(b_dst.to(b_k.dtype)), b_k, input_precision=INPUT_PRECISION)
            tl.atomic_add(acc + 2 * stride_ap + o_i[:, None] * stride_an + o_d[None, :], b_dq,
                          mask=m_i[:, None] & m_d[None, :], sem='relaxed')
    if ACC_INIT:
        # added after the loop (as the start value it spilled at fp32, D = 128)
        m_a = m_jd & (o_t < n_q)[:, None]
        p_a = acc + o_t[:, None] * stride_an + o_d[None, :]
        b_dk += tl.load(p_a, mask=m_a, other=0.)
        b_dv += tl.load(p_a + stride_ap, mask=m_a, other=0.)
    o_r = o_row0 + o_j
    tl.store(dv + o_r[:, None] * stride_gn + o_d[None, :], b_dv.to(dv.dtype.element_ty),
             mask=m_jd)
    _store_rows_grad(b_dk * scale, k, o_t, m_j, stride_kn, cos, sin, stride_rn,
                     o_d, m_d, dk, o_r, stride_gn, dtab, stride_tk, stride_tn, ROPE, ROPE_GRAD,
                     EVEN_D)
