"""Triton kernels of the Newton-Schulz inverse ``V <- 2 V - (V P) V``, ``P = a + eps I``.

Only ``@triton.jit`` functions live here; launchers, the large-matrix PyTorch path and the
autograd Function are in ``function.py``. Conventions shared by the kernels:

* One program per matrix (``program_id(0) = b * heads + h``) runs the whole iteration of one
  matrix, in fp32 with ``tl.dot`` at ``INPUT_PRECISION`` ('ieee': exact fp32, as the iteration
  squares its own rounding errors).
* Every matrix is a contiguous fp32 ``MP x MP`` buffer (``MP``: M padded to a power of two
  >= 16, the smallest ``tl.dot`` tile), zero outside the real ``M x M`` block: the launchers
  pad and convert (a non-constant row stride M made ptxas spill, and so did 16-bit loads),
  so offsets are compile-time and loads/stores need no masks. ``M`` only decides where ``eps``
  goes on the diagonal and which rows count for ``alpha``.
* ``P`` is the identity outside its ``M x M`` block, and so is ``V_0`` (the padding's exact
  inverse, a fixed point). ``P`` and every iterate are then block diagonal, so the padded block
  never mixes into the real one (the result is that of the unpadded iteration); ``alpha`` takes the maximum over the real rows only, and the padded
  block of every gradient stays zero.
* Iterates ``V_0 .. V_{iters-1}`` (the input of each step) go to slot ``k`` of an fp32
  workspace ``[B*heads, n_slots, MP, MP]`` when the forward is told to keep them; the backward
  walks them in reverse.
"""
import triton
import triton.language as tl


@triton.jit
def _diag_term(o_r, o_c, M, eps):
    """The ``eps I`` (real block) + ``I`` (padding) term of P on the tile ``[o_r, o_c]``."""
    return tl.where(o_r[:, None] == o_c[None, :], tl.where(o_r[:, None] < M, eps, 1.), 0.)


@triton.jit
def _initial_factors(b_s, alpha_num):
    """``(r1, r2)`` with ``V_0 = (P * r1) * r2 = alpha_num / s^2 * P``: ``(alpha_num / s^2, 1)``
    while ``s^2`` stays in range (1e-18 < |s| < 1e18, ``naive.SQUARE_SAFE``), else
    ``(1 / s, alpha_num / s)`` (as ``naive.initial_iterate``)."""
    b_in = (tl.abs(b_s) > 1e-18) & (tl.abs(b_s) < 1e18)
    b_sin = tl.where(b_in, b_s, 1.)
    b_sout = tl.where(b_in, 1., b_s)
    return (tl.where(b_in, alpha_num / (b_sin * b_sin), 1. / b_sout),
            tl.where(b_in, 1., alpha_num / b_sout))


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
    ``V_0 .. V_{iters-1}``.

    a, out: ``[B*heads, MP, MP]``; ws: ``[B*heads, iters, MP, MP]``.
    """
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
    """da = dL/da of ``out = V_iters`` for one matrix held whole in registers, given
    ``g = dL/d out``.

    Reverses ``V_{k+1} = 2 V_k - V_k P V_k`` with ``G = dL/dV_{k+1}``::

        dL/dP   -= V_k^T G V_k^T
        dL/dV_k  = 2 G - G (P V_k)^T - (V_k P)^T G

    then ``V_0 = alpha P`` with ``alpha = alpha_num / s^2``, ``s = max_i sum_j P_ij``:
    ``dL/dP += alpha G_0 + dL/ds [i is a largest row] / (number of largest rows)`` with
    ``dL/ds = -2 alpha / s * sum(G_0 * P)``. ``dL/da = dL/dP``.
    a, g, da: ``[B*heads, MP, MP]``; ws: the forward's iterates ``[B*heads, n_slots, MP,
    MP]`` (``V_k`` in slot k, from either forward kernel).
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
    b_alpha = alpha_num / (b_s * b_s)
    b_ds = -2. * b_alpha / b_s * tl.sum(tl.sum(b_g * b_p, 1), 0)  # padded G is zero
    b_top = ((o < M) & (b_rows == b_s)).to(tl.float32)  # [MP] rows reaching the maximum
    b_dp += b_alpha * b_g + (b_ds / tl.sum(b_top, 0) * b_top)[:, None]
    _store_mat_tile(da, o, o, b_dp, MP)


# ---------------------------------------------------------------------------------------------
# Tiled variants for the larger matrices: still one program per matrix, but the iterates live
# in an fp32 scratch in global memory (a few matrices, L1/L2-resident while the program runs)
# and only BT-row / BT-column tiles are in registers. Held whole, MP = 128 needed more registers
# and shared memory (192 KB for the tl.dot operands) than one program has, and spilled.
# Row/column loops run to M (rounded up to BT): tiles past it are padding. Scratch buffers are
# zero-initialised by the launcher, so the rows a loop never writes read as zero.
# A program writes a scratch slot, passes a block barrier (``tl.debug_barrier``, which makes
# its global writes visible to all its threads), then reads it; reads of the previous slot and
# writes of the next one never alias within a step.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _p_tile(a, o_r, o_c, M, eps, MP: tl.constexpr):
    """Tile ``P[o_r, o_c]`` of ``P = a + eps I`` (identity-padded)."""
    return _mat_tile(a, o_r, o_c, MP) + _diag_term(o_r, o_c, M, eps)


@triton.jit
def _pt_tile(a, o_r, o_c, M, eps, MP: tl.constexpr):
    """Tile ``P^T[o_r, o_c]`` (a strided read of P)."""
    return (tl.load(a + o_r[:, None] + o_c[None, :] * MP) + _diag_term(o_r, o_c, M, eps))


@triton.jit
def _max_row_sum(a, M, eps, MP: tl.constexpr, BT: tl.constexpr):
    """``(s, n_top)``: the largest row sum of the real rows of P and how many rows reach it."""
    o_all = tl.arange(0, MP)
    b_s = tl.full([], float('-inf'), tl.float32)
    for i0 in range(0, M, BT):
        o_r = i0 + tl.arange(0, BT)
        b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BT]
        b_s = tl.maximum(b_s, tl.max(tl.where(o_r < M, b_rows, float('-inf')), 0))
    b_n = tl.full([], 0., tl.float32)
    for i0 in range(0, M, BT):
        o_r = i0 + tl.arange(0, BT)
        b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BT]
        b_n += tl.sum(((o_r < M) & (b_rows == b_s)).to(tl.float32), 0)
    return b_s, b_n


@triton.jit
def newton_schulz_fwd_tiled_kernel(
    a, out, ws,
    M, iters, n_slots, eps, alpha_num,
    MP: tl.constexpr, BT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """``newton_schulz_fwd_kernel`` in tiles: iterate ``k`` is scratch slot ``k % n_slots`` of
    ``ws`` (zero-initialised ``[B*heads, n_slots, MP, MP]``): ``n_slots = iters + 1`` keeps
    every iterate for the backward, 2 ping-pongs. Per step and block of BT rows ``i``:
    ``T_i = V_i P`` (``[BT, MP]`` in registers, accumulated over BT-wide chunks), then each
    ``BT x BT`` tile of ``V_new[i] = 2 V_i - T_i V``.
    """
    i_bh = tl.program_id(0).to(tl.int64)
    a += i_bh * MP * MP
    out += i_bh * MP * MP
    ws += i_bh * n_slots * MP * MP
    o_all = tl.arange(0, MP)  # [MP]

    b_s, _ = _max_row_sum(a, M, eps, MP, BT)
    b_r1, b_r2 = _initial_factors(b_s, alpha_num)
    for i0 in range(0, M, BT):  # V_0 = alpha P, I on the padding (see the whole-matrix kernel)
        o_r = i0 + tl.arange(0, BT)
        b_p = _p_tile(a, o_r, o_all, M, eps, MP)  # [BT, MP]
        _store_mat_tile(ws, o_r, o_all, tl.where((o_r < M)[:, None], b_p * b_r1 * b_r2, b_p), MP)
    tl.debug_barrier()
    for k in range(iters):
        src = ws + (k % n_slots) * MP * MP
        dst = ws + ((k + 1) % n_slots) * MP * MP
        for i0 in range(0, M, BT):
            o_r = i0 + tl.arange(0, BT)  # [BT] rows of this block
            b_t = tl.zeros([BT, MP], dtype=tl.float32)  # T_i = V_i P
            for k0 in range(0, M, BT):
                o_k = k0 + tl.arange(0, BT)
                b_t += tl.dot(_mat_tile(src, o_r, o_k, MP), _p_tile(a, o_k, o_all, M, eps, MP),
                              input_precision=INPUT_PRECISION)
            for j0 in range(0, M, BT):
                o_c = j0 + tl.arange(0, BT)
                b_w = tl.dot(b_t, _mat_tile(src, o_all, o_c, MP),
                             input_precision=INPUT_PRECISION)  # [BT, BT] (T_i V)[:, j]
                _store_mat_tile(dst, o_r, o_c, 2. * _mat_tile(src, o_r, o_c, MP) - b_w, MP)
        tl.debug_barrier()
    src = ws + (iters % n_slots) * MP * MP
    for i0 in range(0, M, BT):
        o_r = i0 + tl.arange(0, BT)
        _store_mat_tile(out, o_r, o_all, _mat_tile(src, o_r, o_all, MP), MP)


@triton.jit
def newton_schulz_bwd_tiled_kernel(
    a, g, ws, scratch, da,
    M, iters, n_slots, eps, alpha_num,
    MP: tl.constexpr, BT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """``newton_schulz_bwd_kernel`` in tiles. ``ws``: the forward's iterates (``V_k`` in slot
    k); ``scratch``: zero-initialised ``[B*heads, 4, MP, MP]`` holding G (slots 0/1,
    ping-pong), ``Q = V^T G`` (slot 2) and the running ``dL/dP`` (slot 3). Per step walked
    back, two passes over blocks of BT rows ``i`` with a barrier after each: (1)
    ``Q_i = (V^T G)_i`` (stored); (2) ``R_i = G_i V^T`` (in registers), then tile by tile
    ``G_new[i, j] = 2 G_ij - (P^T Q)_ij - (R_i P^T)_j`` and ``dP_ij -= (Q V^T)_ij`` (they need
    all of Q, hence the barrier; Q is read back in BT-wide chunks: a full-width Q_i as a
    tl.dot operand spilled).
    """
    i_bh = tl.program_id(0).to(tl.int64)
    a += i_bh * MP * MP
    g += i_bh * MP * MP
    da += i_bh * MP * MP
    ws += i_bh * n_slots * MP * MP
    scratch += i_bh * 4 * MP * MP
    s_q = scratch + 2 * MP * MP
    s_dp = scratch + 3 * MP * MP
    o_all = tl.arange(0, MP)  # [MP]

    for i0 in range(0, M, BT):  # G = g (dP starts at zero: the scratch is zeroed)
        o_r = i0 + tl.arange(0, BT)
        _store_mat_tile(scratch, o_r, o_all, _mat_tile(g, o_r, o_all, MP), MP)
    tl.debug_barrier()
    for kk in range(iters):
        s_v = ws + (iters - 1 - kk) * MP * MP
        s_g = scratch + (kk % 2) * MP * MP
        s_gn = scratch + ((kk + 1) % 2) * MP * MP
        for i0 in range(0, M, BT):  # pass 1: Q_i = sum_k V[k, i]^T G[k, :]
            o_r = i0 + tl.arange(0, BT)
            b_q = tl.zeros([BT, MP], dtype=tl.float32)
            for k0 in range(0, M, BT):
                o_k = k0 + tl.arange(0, BT)
                b_q += tl.dot(tl.trans(_mat_tile(s_v, o_k, o_r, MP)),
                              _mat_tile(s_g, o_k, o_all, MP), input_precision=INPUT_PRECISION)
            _store_mat_tile(s_q, o_r, o_all, b_q, MP)
        tl.debug_barrier()
        for i0 in range(0, M, BT):  # pass 2
            o_r = i0 + tl.arange(0, BT)
            b_r = tl.zeros([BT, MP], dtype=tl.float32)  # R_i = G_i V^T
            for k0 in range(0, M, BT):
                o_k = k0 + tl.arange(0, BT)
                b_r += tl.dot(_mat_tile(s_g, o_r, o_k, MP),
                              tl.trans(_mat_tile(s_v, o_all, o_k, MP)),
                              input_precision=INPUT_PRECISION)
            for j0 in range(0, M, BT):
                o_c = j0 + tl.arange(0, BT)
                b_acc = tl.dot(b_r, _pt_tile(a, o_all, o_c, M, eps, MP),
                               input_precision=INPUT_PRECISION)  # [BT, BT] (R_i P^T)[:, j]
                b_qvt = tl.zeros([BT, BT], dtype=tl.float32)
                for k0 in range(0, M, BT):  # (P^T Q)[i, j] and (Q V^T)[i, j]
                    o_k = k0 + tl.arange(0, BT)
                    b_acc += tl.dot(_pt_tile(a, o_r, o_k, M, eps, MP),
                                    _mat_tile(s_q, o_k, o_c, MP), input_precision=INPUT_PRECISION)
                    b_qvt += tl.dot(_mat_tile(s_q, o_r, o_k, MP),
                                    tl.trans(_mat_tile(s_v, o_c, o_k, MP)),
                                    input_precision=INPUT_PRECISION)
                _store_mat_tile(s_gn, o_r, o_c, 2. * _mat_tile(s_g, o_r, o_c, MP) - b_acc, MP)
                _store_mat_tile(s_dp, o_r, o_c, _mat_tile(s_dp, o_r, o_c, MP) - b_qvt, MP)
        tl.debug_barrier()
    # V_0 = alpha P: dP += alpha G_0 + dL/ds [i is a largest row] / n_top
    s_g = scratch + (iters % 2) * MP * MP
    b_s, b_n = _max_row_sum(a, M, eps, MP, BT)
    b_alpha = alpha_num / (b_s * b_s)
    b_c = tl.full([], 0., tl.float32)
    for i0 in range(0, M, BT):  # sum(G_0 * P), padded G is zero
        o_r = i0 + tl.arange(0, BT)
        b_c += tl.sum(tl.sum(_mat_tile(s_g, o_r, o_all, MP)
                             * _p_tile(a, o_r, o_all, M, eps, MP), 1), 0)
    b_ds = -2. * b_alpha / b_s * b_c
    for i0 in range(0, M, BT):
        o_r = i0 + tl.arange(0, BT)
        b_rows = tl.sum(_p_tile(a, o_r, o_all, M, eps, MP), 1)  # [BT]
        b_top = ((o_r < M) & (b_rows == b_s)).to(tl.float32)
        b_dp = (_mat_tile(s_dp, o_r, o_all, MP) + b_alpha * _mat_tile(s_g, o_r, o_all, MP)
                + (b_ds / b_n * b_top)[:, None])
        _store_mat_tile(da, o_r, o_all, b_dp, MP)
