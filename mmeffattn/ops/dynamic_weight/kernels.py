"""Triton kernels of WeightFormer's bilateral dynamic weight; launchers in ``function.py``.

``R = s v^T u`` (``s = scale / n_tokens``), out ``= R_j / (||R_j|| + 1) (+ W_j)``. A program
covers all of ``C_in`` for a block of output rows (the norm needs the row): one register tile,
or a sweep that computes the tiles twice instead of using a workspace. fp32 accumulation.
"""
import triton
import triton.language as tl

from .._common_kernels import row_norm_grad


@triton.jit
def _row_block(C_out, BO: tl.constexpr):
    """``(o_o, m_o, i_b)``: this program's output rows ([BO], ``program_id(0)``), their mask
    and its sample (``program_id(1)``, int64)."""
    o_o = tl.program_id(0) * BO + tl.arange(0, BO)  # [BO]
    return o_o, o_o < C_out, tl.program_id(1).to(tl.int64)


@triton.jit
def _col_tile(i_t, C_in, BI: tl.constexpr):
    """``(o_i, m_i)``: the columns ([BI]) of column tile ``i_t`` and their mask."""
    o_i = i_t * BI + tl.arange(0, BI)  # [BI]
    return o_i, o_i < C_in


@triton.jit
def _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
              BO: tl.constexpr, BI: tl.constexpr, BM: tl.constexpr,
              INPUT_PRECISION: tl.constexpr):
    """``s * sum_m v[m, o] u[m, i]`` for the rows ``o_o`` ([BO]) and columns ``o_i`` ([BI]) of
    one sample (``u``, ``v`` point at it); returns ``[BO, BI]`` fp32, zero where masked."""
    b_acc = tl.zeros([BO, BI], dtype=tl.float32)
    for m0 in range(0, M, BM):
        o_m = m0 + tl.arange(0, BM)  # [BM]
        m_m = o_m < M  # [BM]
        b_v = tl.load(v + o_m[:, None] * stride_vm + o_o[None, :],
                      mask=m_m[:, None] & m_o[None, :], other=0.)  # [BM, BO]
        b_u = tl.load(u + o_m[:, None] * stride_um + o_i[None, :],
                      mask=m_m[:, None] & m_i[None, :], other=0.)  # [BM, BI]
        b_acc += tl.dot(tl.trans(b_v), b_u, input_precision=INPUT_PRECISION)  # [BO, BI]
    return b_acc * s


@triton.jit
def _store_out(b_r, b_inv, w, out, o_o, m_o, o_i, m_i, stride_wo, stride_oo,
               HAS_WEIGHT: tl.constexpr):
    """Store ``R_j / (||R_j|| + 1) (+ W_j)`` (``b_inv``: ``1 / (||R_j|| + 1)``) of one tile."""
    b_out = b_r * b_inv[:, None]  # [BO, BI]
    m_oi = m_o[:, None] & m_i[None, :]  # [BO, BI]
    if HAS_WEIGHT:
        b_out += tl.load(w + o_o[:, None] * stride_wo + o_i[None, :], mask=m_oi,
                         other=0.).to(tl.float32)
    tl.store(out + o_o[:, None] * stride_oo + o_i[None, :], b_out.to(out.dtype.element_ty),
             mask=m_oi)


@triton.jit
def dynamic_weight_fwd_kernel(
    u, v, w, out,
    stride_ub, stride_um,
    stride_vb, stride_vm,
    stride_wo,
    stride_ob, stride_oo,
    M, C_in, C_out, s,
    BO: tl.constexpr, BI: tl.constexpr, BM: tl.constexpr, NUM_I_TILES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """out[b] = R / (||R_j|| + 1) (+ w), R = s v[b]^T u[b]; one block of output rows per program."""
    o_o, m_o, i_b = _row_block(C_out, BO)
    u += i_b * stride_ub
    v += i_b * stride_vb
    out += i_b * stride_ob
    if NUM_I_TILES == 1:
        o_i, m_i = _col_tile(0, C_in, BI)
        b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                        BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
        b_inv = 1. / (tl.sqrt(tl.sum(b_r * b_r, 1)) + 1.)  # [BO]
        _store_out(b_r, b_inv, w, out, o_o, m_o, o_i, m_i, stride_wo, stride_oo, HAS_WEIGHT)
    else:
        # sweep 1: squared row norms over all column tiles
        b_ss = tl.zeros([BO], dtype=tl.float32)  # [BO]
        for i_t in range(NUM_I_TILES):
            o_i, m_i = _col_tile(i_t, C_in, BI)
            b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                            BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
            b_ss += tl.sum(b_r * b_r, 1)
        b_inv = 1. / (tl.sqrt(b_ss) + 1.)  # [BO]
        # sweep 2: recompute, normalize, store
        for i_t in range(NUM_I_TILES):
            o_i, m_i = _col_tile(i_t, C_in, BI)
            b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                            BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
            _store_out(b_r, b_inv, w, out, o_o, m_o, o_i, m_i, stride_wo, stride_oo, HAS_WEIGHT)


@triton.jit
def _g_tile(g, o_o, m_o, o_i, m_i, stride_go):
    """The fp32 ``[BO, BI]`` tile of the output gradient, zero where masked."""
    return tl.load(g + o_o[:, None] * stride_go + o_i[None, :],
                   mask=m_o[:, None] & m_i[None, :], other=0.).to(tl.float32)


@triton.jit
def dynamic_weight_bwd_dp_kernel(
    u, v, g, dp,
    stride_ub, stride_um,
    stride_vb, stride_vm,
    stride_gb, stride_go,
    stride_pb, stride_po,
    M, C_in, C_out, s,
    BO: tl.constexpr, BI: tl.constexpr, BM: tl.constexpr, NUM_I_TILES: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """dp[b] = dL/d(v^T u) of sample b: recomputes R (no saved statistics) and back-propagates
    the row normalization and the scale; the gradients of u and v are then the products
    ``v dp`` and ``u dp^T`` (``dynamic_weight_bmm_kernel``).

    g: output gradient ``[B, C_out, C_in]`` (unit stride on C_in); dp: ``[B, C_out, C_in]``, in
    u's dtype (the operand of the next products).
    """
    o_o, m_o, i_b = _row_block(C_out, BO)
    u += i_b * stride_ub
    v += i_b * stride_vb
    g += i_b * stride_gb
    dp += i_b * stride_pb
    if NUM_I_TILES == 1:
        o_i, m_i = _col_tile(0, C_in, BI)
        m_oi = m_o[:, None] & m_i[None, :]  # [BO, BI]
        b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                        BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
        b_g = _g_tile(g, o_o, m_o, o_i, m_i, stride_go)  # [BO, BI]
        b_n = tl.sqrt(tl.sum(b_r * b_r, 1))  # [BO]
        b_c = tl.sum(b_g * b_r, 1)  # [BO]
        b_dp = row_norm_grad(b_r, b_g, b_n, b_c) * s  # [BO, BI] dL/dP, P = R / s
        tl.store(dp + o_o[:, None] * stride_po + o_i[None, :], b_dp.to(dp.dtype.element_ty),
                 mask=m_oi)
    else:
        b_ss = tl.zeros([BO], dtype=tl.float32)  # [BO]
        b_c = tl.zeros([BO], dtype=tl.float32)  # [BO]
        for i_t in range(NUM_I_TILES):
            o_i, m_i = _col_tile(i_t, C_in, BI)
            b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                            BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
            b_g = _g_tile(g, o_o, m_o, o_i, m_i, stride_go)  # [BO, BI]
            b_ss += tl.sum(b_r * b_r, 1)
            b_c += tl.sum(b_g * b_r, 1)
        b_n = tl.sqrt(b_ss)  # [BO]
        for i_t in range(NUM_I_TILES):
            o_i, m_i = _col_tile(i_t, C_in, BI)
            m_oi = m_o[:, None] & m_i[None, :]  # [BO, BI]
            b_r = _raw_tile(u, v, o_o, m_o, o_i, m_i, M, stride_um, stride_vm, s,
                            BO, BI, BM, INPUT_PRECISION)  # [BO, BI]
            b_g = _g_tile(g, o_o, m_o, o_i, m_i, stride_go)  # [BO, BI]
            b_dp = row_norm_grad(b_r, b_g, b_n, b_c) * s  # [BO, BI] dL/dP, P = R / s
            tl.store(dp + o_o[:, None] * stride_po + o_i[None, :],
                     b_dp.to(dp.dtype.element_ty), mask=m_oi)


@triton.jit
def dynamic_weight_bmm_kernel(
    a, b, c,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm,
    M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """c[i] = a[i] @ b[i] per sample (any strides: a transpose is a stride swap), for the
    backward's ``du = v dp`` and ``dv = u dp^T``; one program per output tile, N fastest."""
    i_t = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    n_tiles_n = tl.cdiv(N, BN)
    i_m = i_t // n_tiles_n
    i_n = i_t % n_tiles_n
    a += i_s * stride_ab
    b += i_s * stride_bb
    c += i_s * stride_cb

    o_m = i_m * BM + tl.arange(0, BM)  # [BM]
    o_n = i_n * BN + tl.arange(0, BN)  # [BN]
    m_m = o_m < M  # [BM]
    m_n = o_n < N  # [BN]
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)  # [BK]
        m_k = o_k < K  # [BK]
        b_a = tl.load(a + o_m[:, None] * stride_am + o_k[None, :] * stride_ak,
                      mask=m_m[:, None] & m_k[None, :], other=0.)  # [BM, BK]
        b_b = tl.load(b + o_k[:, None] * stride_bk + o_n[None, :] * stride_bn,
                      mask=m_k[:, None] & m_n[None, :], other=0.)  # [BK, BN]
        b_acc += tl.dot(b_a, b_b, input_precision=INPUT_PRECISION)  # [BM, BN]
    tl.store(c + o_m[:, None] * stride_cm + o_n[None, :], b_acc.to(c.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])
