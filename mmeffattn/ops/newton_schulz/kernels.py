"""Triton kernels of the Newton-Schulz inverse ``V <- 2 V - (V P) V``, ``P = a + eps I``.

All fp32 on identity-padded ``MP x MP`` buffers (P and every iterate stay block diagonal, so no
masks): whole-matrix kernels run the iteration in one launch, multi-program ones one step per
launch. Iterates ``V_k`` go to slot k of a workspace for the backward (docs/design/ops_kernels.md).
"""
import triton
import triton.language as tl


@triton.jit
def _diag_term(o_r, o_c, M, eps):
    """The ``eps I`` (real block) + ``I`` (padding) term of P on the tile ``[o_r, o_c]``."""
    return tl.where(o_r[:, None] == o_c[None, :], tl.where(o_r[:, None] < M, eps, 1.), 0.)


@triton.jit
def _initial_factors(b_s, alpha_num):
    """``(1 / s, alpha_num / s)``: ``V_0 = alpha P`` as ``(P / s) (alpha_num / s)``, in range
    where ``s^2`` is not (as ``pytorch.initial_iterate``)."""
    return 1. / b_s, alpha_num / b_s


@triton.jit
def _mat_tile(s, o_r, o_c, MP: tl.constexpr):
    """Tile ``[o_r, o_c]`` of a contiguous ``MP x MP`` matrix."""
    return tl.load(s + o_r[:, None] * MP + o_c[None, :])


@triton.jit
def _store_mat_tile(s, o_r, o_c, b_x, MP: tl.constexpr):
    tl.store(s + o_r[:, None] * MP + o_c[None, :], b_x)


@triton.jit
def newton_schulz_fwd_kernel(
    a, out, ws,
    M, iters, eps, alpha_num,
    MP: tl.constexpr, STORE_ITERATES: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """out = V_iters for one matrix held whole in registers; ``ws`` (if STORE_ITERATES) gets
    ``V_0 .. V_{iters-1}``."""
    i_bh = tl.program_id(0).to(tl.int64)
    a += i_bh * MP * MP
    out += i_bh * MP * MP
    ws += i_bh * iters * MP * MP

    o = tl.arange(0, MP)  # [MP]
    b_p = _mat_tile(a, o, o, MP) + _diag_term(o, o, M, eps)  # [MP, MP]
    b_s = tl.max(tl.where(o < M, tl.sum(b_p, 1), float('-inf')), 0)  # largest real row sum
    b_r1, b_r2 = _initial_factors(b_s, alpha_num)
    # V_0 = alpha P; the padded block starts at (and stays) its exact inverse I, since alpha I
    # may be out of range there (and inf * 0 in a product would reach the real block)
    b_v = tl.where((o < M)[:, None], b_p * b_r1 * b_r2, b_p)  # [MP, MP]
    for k in range(iters):
        if STORE_ITERATES:
            _store_mat_tile(ws + k * MP * MP, o, o, b_v, MP)
        b_t = tl.dot(b_v, b_p, input_precision=INPUT_PRECISION)  # [MP, MP] V P
        b_v = 2. * b_v - tl.dot(b_t, b_v, input_precision=INPUT_PRECISION)
    _store_mat_tile(out, o, o, b_v, MP)


@triton.jit
def newton_schulz_bwd_kernel(
    a, g, ws, da,
    M, iters, n_slots, eps, alpha_num,
    MP: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """da = dL/da of ``out = V_iters`` (one matrix in registers) given ``g = dL/d out``.
    Reverses ``V_{k+1} = 2 V_k - V_k P V_k`` with ``G = dL/dV_{k+1}``::

        dL/dP   -= V_k^T G V_k^T
        dL/dV_k  = 2 G - G (P V_k)^T - (V_k P)^T G

    then ``V_0 = alpha P`` with ``alpha = alpha_num / s^2``, ``s = max_i sum_j P_ij``:
    ``dL/dP += alpha G_0 + dL/ds [i is a largest row] / (number of largest rows)`` with
    ``dL/ds = -2 alpha / s * sum(G_0 * P)``, alpha applied as the forward's two in-range factors
    (:func:`_initial_factors`). ``dL/da = dL/dP``. ws: the forward's iterates.
    """
    i_bh = tl.program_id(0).to(tl.int64)
    a += i_bh * MP * MP
    g += i_bh * MP * MP
    da += i_bh * MP * MP
    ws += i_bh * n_slots * MP * MP

    o = tl.arange(0, MP)  # [MP]
    b_p = _mat_tile(a, o, o, MP) + _diag_term(o, o, M, eps)  # [MP, MP]
    b_pt = tl.trans(b_p)
    b_g = _mat_tile(g, o, o, MP)  # [MP, MP]
    b_dp = tl.zeros([MP, MP], dtype=tl.float32)
    for kk in range(iters):
        b_vt = tl.trans(_mat_tile(ws + (iters - 1 - kk) * MP * MP, o, o, MP))  # V_k^T
        b_vtg = tl.dot(b_vt, b_g, input_precision=INPUT_PRECISION)  # V^T G
        b_dp -= tl.dot(b_vtg, b_vt, input_precision=INPUT_PRECISION)  # V^T G V^T
        # (V P)^T G = P^T (V^T G); G (P V)^T = (G V^T) P^T
        b_gvt = tl.dot(b_g, b_vt, input_precision=INPUT_PRECISION)  # G V^T
        b_g = (2. * b_g - tl.dot(b_pt, b_vtg, input_precision=INPUT_PRECISION)
               - tl.dot(b_gvt, b_pt, input_precision=INPUT_PRECISION))
    b_rows = tl.sum(b_p, 1)  # [MP]
    b_s = tl.max(tl.where(o < M, b_rows, float('-inf')), 0)
    b_r1, b_r2 = _initial_factors(b_s, alpha_num)  # alpha = r1 r2
    b_ds = -2. * (tl.sum(tl.sum(b_g * b_p, 1), 0) * b_r1 * b_r2) / b_s  # padded G is zero
    b_top = ((o < M) & (b_rows == b_s)).to(tl.float32)  # [MP] rows reaching the maximum
    b_dp += b_g * b_r1 * b_r2 + (b_ds / tl.sum(b_top, 0) * b_top)[:, None]
    _store_mat_tile(da, o, o, b_dp, MP)


# Multi-program kernels (MP >= 64): program ``(i_r, bh)`` owns rows ``[i_r BR, (i_r + 1) BR)``
# of one matrix, one launch per step (a step needs all of the previous iterate). ``stride_*``:
# a buffer's batch*head stride. Operands are read in BK-wide chunks (loops: unrolled, spills).
@triton.jit
def _row_program(MP: tl.constexpr, BR: tl.constexpr):
    """``(i_bh, o_r, o_all)``: program ``(i_r, bh)``'s matrix, its rows and all columns."""
    o_r = tl.program_id(0) * BR + tl.arange(0, BR)
    return tl.program_id(1).to(tl.int64), o_r, tl.arange(0, MP)


@triton.jit
def _p_tile(a, o_r, o_c, M, eps, MP: tl.constexpr):
    """Tile ``P[o_r, o_c]`` of ``P = a + eps I`` (identity-padded)."""
    return _mat_tile(a, o_r, o_c, MP) + _diag_term(o_r, o_c, M, eps)


@triton.jit
def _pt_tile(a, o_r, o_c, M, eps, MP: tl.constexpr):
    """Tile ``P^T[o_r, o_c]``: the contiguous tile ``P[o_c, o_r]`` transposed in registers."""
    return tl.trans(_p_tile(a, o_c, o_r, M, eps, MP))


@triton.jit
def _max_row_sum(a, M, eps, MP: tl.constexpr, BR: tl.constexpr):
    """``(s, n_top)``: the largest row sum of the real rows of P and how many rows reach it
    (each program of a matrix recomputes them: ``MP^2`` reads, next to its ``BR MP^2`` MACs)."""
    o_all = tl.arange(0, MP)
    b_s = tl.full([], float('-inf'), tl.float32)
    for i0 in tl.static_range(0, MP, BR):
        o_r = i0 + tl.arange(0, BR)
        b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BR]
        b_s = tl.maximum(b_s, tl.max(tl.where(o_r < M, b_rows, float('-inf')), 0))
    b_n = tl.full([], 0., tl.float32)
    for i0 in tl.static_range(0, MP, BR):
        o_r = i0 + tl.arange(0, BR)
        b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BR]
        b_n += tl.sum(((o_r < M) & (b_rows == b_s)).to(tl.float32), 0)
    return b_s, b_n


@triton.jit
def newton_schulz_init_kernel(
    a, dst, stride_dst, M, eps, alpha_num,
    MP: tl.constexpr, BR: tl.constexpr,
):
    """``dst = V_0 = alpha P`` (I on the padding) for the rows of program ``(i_r, bh)``."""
    i_bh, o_r, o_all = _row_program(MP, BR)
    a += i_bh * MP * MP
    dst += i_bh * stride_dst
    b_s, _ = _max_row_sum(a, M, eps, MP, BR)
    b_r1, b_r2 = _initial_factors(b_s, alpha_num)
    b_p = _p_tile(a, o_r, o_all, M, eps, MP)  # [BR, MP]
    _store_mat_tile(dst, o_r, o_all, tl.where((o_r < M)[:, None], b_p * b_r1 * b_r2, b_p), MP)


@triton.jit
def newton_schulz_step_kernel(
    a, src, dst, stride_src, stride_dst, M, eps,
    MP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """One step ``dst = 2 V - (V P) V`` (``V = src``) for program ``(i_r, bh)``'s BR rows:
    ``T_i = V_i P`` in registers, then ``2 V_ij - T_i V[:, j]`` per BK-wide chunk."""
    i_bh, o_r, o_all = _row_program(MP, BR)
    a += i_bh * MP * MP
    src += i_bh * stride_src
    dst += i_bh * stride_dst
    b_t = tl.zeros([BR, MP], dtype=tl.float32)
    for k0 in range(0, MP, BK):
        o_k = k0 + tl.arange(0, BK)
        b_t += tl.dot(_mat_tile(src, o_r, o_k, MP), _p_tile(a, o_k, o_all, M, eps, MP),
                      input_precision=INPUT_PRECISION)
    for j0 in range(0, MP, BK):
        o_c = j0 + tl.arange(0, BK)
        b_w = tl.dot(b_t, _mat_tile(src, o_all, o_c, MP), input_precision=INPUT_PRECISION)
        _store_mat_tile(dst, o_r, o_c, 2. * _mat_tile(src, o_r, o_c, MP) - b_w, MP)


@triton.jit
def newton_schulz_bwd_q_kernel(
    v, g, q, stride_v, stride_g,
    MP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """``Q = V^T G`` for the BR rows ``i`` of program ``(i_r, bh)``:
    ``Q_i = sum_k V[k, i]^T G[k, :]``. q: ``[B*heads, MP, MP]``."""
    i_bh, o_r, o_all = _row_program(MP, BR)
    v += i_bh * stride_v
    g += i_bh * stride_g
    q += i_bh * MP * MP
    b_q = tl.zeros([BR, MP], dtype=tl.float32)
    for k0 in range(0, MP, BK):
        o_k = k0 + tl.arange(0, BK)
        b_q += tl.dot(tl.trans(_mat_tile(v, o_k, o_r, MP)), _mat_tile(g, o_k, o_all, MP),
                      input_precision=INPUT_PRECISION)
    _store_mat_tile(q, o_r, o_all, b_q, MP)


@triton.jit
def newton_schulz_bwd_step_kernel(
    a, v, g, q, g_new, dp, stride_v, stride_g, M, eps,
    MP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """One step walked back, for the BR rows ``i`` of program ``(i_r, bh)``, given
    ``Q = V^T G`` (``newton_schulz_bwd_q_kernel``)::

        R_i = G_i V^T                                   ([BR, MP], in registers)
        G_new[i, j] = 2 G_ij - (R_i P^T)_j - (P^T Q)_ij  (= dL/dV_k)
        dP[i, j]   -= (Q V^T)_ij

    per BK-wide column chunk ``j``; dp is updated in place (each program owns its rows).
    """
    i_bh, o_r, o_all = _row_program(MP, BR)
    a += i_bh * MP * MP
    v += i_bh * stride_v
    g += i_bh * stride_g
    q += i_bh * MP * MP
    g_new += i_bh * MP * MP
    dp += i_bh * MP * MP
    b_r = tl.zeros([BR, MP], dtype=tl.float32)
    for k0 in range(0, MP, BK):
        o_k = k0 + tl.arange(0, BK)
        b_r += tl.dot(_mat_tile(g, o_r, o_k, MP), tl.trans(_mat_tile(v, o_all, o_k, MP)),
                      input_precision=INPUT_PRECISION)
    for j0 in range(0, MP, BK):
        o_c = j0 + tl.arange(0, BK)
        b_acc = tl.dot(b_r, _pt_tile(a, o_all, o_c, M, eps, MP),
                       input_precision=INPUT_PRECISION)  # [BR, BK] (R_i P^T)[:, j]
        b_qvt = tl.zeros([BR, BK], dtype=tl.float32)
        for k0 in range(0, MP, BK):
            o_k = k0 + tl.arange(0, BK)
            b_acc += tl.dot(_pt_tile(a, o_r, o_k, M, eps, MP), _mat_tile(q, o_k, o_c, MP),
                            input_precision=INPUT_PRECISION)
            b_qvt += tl.dot(_mat_tile(q, o_r, o_k, MP), tl.trans(_mat_tile(v, o_c, o_k, MP)),
                            input_precision=INPUT_PRECISION)
        _store_mat_tile(g_new, o_r, o_c, 2. * _mat_tile(g, o_r, o_c, MP) - b_acc, MP)
        _store_mat_tile(dp, o_r, o_c, _mat_tile(dp, o_r, o_c, MP) - b_qvt, MP)


@triton.jit
def newton_schulz_bwd_alpha_kernel(
    a, g, dp, da, stride_g, M, eps, alpha_num,
    MP: tl.constexpr, BR: tl.constexpr,
):
    """``da = dP + alpha G_0 + dL/ds [i is a largest row] / n_top`` (``g = G_0``) for
    program ``(i_r, bh)``'s rows; dp may alias da."""
    i_bh, o_r, o_all = _row_program(MP, BR)
    a += i_bh * MP * MP
    g += i_bh * stride_g
    dp += i_bh * MP * MP
    da += i_bh * MP * MP
    b_s, b_n = _max_row_sum(a, M, eps, MP, BR)
    b_r1, b_r2 = _initial_factors(b_s, alpha_num)  # alpha = r1 r2
    b_c = tl.full([], 0., tl.float32)
    for i0 in range(0, MP, BR):  # sum(G_0 * P)
        o_i = i0 + tl.arange(0, BR)
        b_c += tl.sum(tl.sum(_mat_tile(g, o_i, o_all, MP) * _p_tile(a, o_i, o_all, M, eps, MP),
                             1), 0)
    b_ds = -2. * (b_c * b_r1 * b_r2) / b_s
    b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BR]
    b_top = ((o_r < M) & (b_rows == b_s)).to(tl.float32)
    b_da = (_mat_tile(dp, o_r, o_all, MP) + _mat_tile(g, o_r, o_all, MP) * b_r1 * b_r2
            + (b_ds / b_n * b_top)[:, None])
    _store_mat_tile(da, o_r, o_all, b_da, MP)
