"""How spread out attention weights are, per query, for each attention kind (SEMA's argument).

SEMA's paper argues that global softmax attention *disperses* as the token count grows: each
query's weights flatten towards uniform, its entropy grows like ``log N`` and its largest weight
shrinks, so the output degrades to an average. Localized attention (windows) keeps a fixed
number of keys; SEMA adds the global mean explicitly. This module measures that from real
queries and keys.

For each kind, :func:`implied_weights` gives the weights ``p[i, j]`` (rows sum to 1) with which
query ``i`` mixes the values ``v_j`` of one attention layer:

* ``softmax``: ``softmax(q k^T / sqrt(D))``.
* ``linear``: ``phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`` with ``phi = ELU + 1``.
* ``window``: softmax inside the query's ``window x window`` window, zero outside.
* ``sema``: ``out_i = sum_j a_ij v_j + mean_j v_j`` weighs ``v_j`` by ``a_ij + 1/N`` (total
  2), halved to a distribution.
* ``laplacian_nystrom``: ``K(q, L) pinv(K(L, L)) K(L, k) / N`` (LaplacianFormer, landmarks
  ``L`` pooled over cells); the Nystrom weights may be negative and need not sum to 1, so the
  distribution is ``|w_ij| / sum_j |w_ij|``.
* ``core_periphery``: a patch reads the C cores only; the cores read every token. The implied
  weight of patch ``j`` for patch ``i`` is the two-hop ``sum_c A[i, c] B[c, j]`` (patch -> core
  -> patch, the route by which patches exchange information), with ``A`` the patch-to-core and
  ``B`` the core-to-patch softmax. Without a VECA model the cores are the tokens average pooled
  to a ``sqrt(C) x sqrt(C)`` grid.

:func:`dispersion_stats` summarises rows: entropy (nats), entropy over ``log N``, the largest
weight, and the effective number of keys ``exp(entropy)``.
"""
import math
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ['KINDS', 'implied_weights', 'dispersion_stats', 'sample_queries', 'kinds_available']

KINDS = ('softmax', 'linear', 'window', 'sema', 'laplacian_nystrom', 'core_periphery')


def sample_queries(n: int, max_queries: int, seed: int = 0) -> torch.Tensor:
    """Indices of at most ``max_queries`` of ``n`` query rows (all when ``n`` is small), fixed
    by ``seed``, so that ``N x N`` weights are never formed at large ``N``."""
    if n <= max_queries:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:max_queries].sort().values


def _window_ids(hw: Tuple[int, int], window: int, device: torch.device) -> torch.Tensor:
    """``[N]`` index of the window each token of an ``H x W`` grid falls in (row-major)."""
    H, W = hw
    rows = torch.arange(H, device=device) // min(window, H)
    cols = torch.arange(W, device=device) // min(window, W)
    n_w = math.ceil(W / min(window, W))
    return (rows[:, None] * n_w + cols[None, :]).flatten()


def _pool_grid(x: torch.Tensor, hw: Tuple[int, int], cell: int) -> torch.Tensor:
    """``[B, h, N, D]`` tokens of an ``H x W`` grid -> ``[B, h, M, D]`` means over cells."""
    B, nh, N, D = x.shape
    grid = x.transpose(-2, -1).reshape(B * nh, D, *hw)
    pooled = F.avg_pool2d(grid, cell, ceil_mode=True)
    return pooled.flatten(2).transpose(-2, -1).reshape(B, nh, -1, D)


def implied_weights(kind: str, q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int],
                    rows: Optional[torch.Tensor] = None, *, window: int = 7,
                    num_cores: int = 16, cores: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                    landmark_cell: int = 8, lam: float = 4., ns_iters: int = 20,
                    ns_eps: float = 0.01) -> torch.Tensor:
    """Weights ``[B, h, len(rows), N]`` (rows sum to 1) of the queries ``rows`` over the N keys.

    Args:
        kind: one of :data:`KINDS`.
        q, k: ``[B, h, N, D]`` queries and keys of one layer, ``N = H * W`` in row-major order.
        hw: the token grid.
        rows: query indices (default: all).
        window: window side of ``window`` and ``sema``.
        num_cores: cores pooled from the tokens for ``core_periphery`` when ``cores`` is None.
        cores: ``(q_cores, k_cores)`` ``[B, h, C, D]`` of a real core-periphery model.
        landmark_cell, lam, ns_iters, ns_eps: LaplacianFormer's settings.
    """
    if kind not in KINDS:
        raise ValueError(f'unknown attention kind {kind!r}; choose from {KINDS}')
    B, nh, N, D = q.shape
    if N != hw[0] * hw[1]:
        raise ValueError(f'{N} tokens do not fill the grid {hw}')
    rows = torch.arange(N) if rows is None else rows
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    scale = D ** -0.5
    if kind in ('softmax', 'window', 'sema'):
        logits = (qs @ k.transpose(-2, -1)) * scale  # [B, h, R, N]
        if kind == 'softmax':
            return logits.softmax(-1)
        ids = _window_ids(hw, window, q.device)
        same = ids[rows.to(q.device)][:, None] == ids[None, :]  # [R, N]
        local = logits.masked_fill(~same, float('-inf')).softmax(-1)
        return local if kind == 'window' else (local + 1.0 / N) / 2
    if kind == 'linear':
        fq, fk = F.elu(qs) + 1, F.elu(k) + 1
        w = fq @ fk.transpose(-2, -1)  # [B, h, R, N], positive
        return w / w.sum(-1, keepdim=True)
    if kind == 'laplacian_nystrom':
        from mmeffattn.ops import laplacian_kernel_naive, newton_schulz_pinv_naive
        lm = _pool_grid(q, hw, landmark_cell)  # landmarks from the queries, as LaplacianFormer
        k_ql = laplacian_kernel_naive(qs, lm, lam)  # [B, h, R, M]
        k_lk = laplacian_kernel_naive(lm, k, lam)  # [B, h, M, N]
        pinv = newton_schulz_pinv_naive(laplacian_kernel_naive(lm, lm, lam), ns_iters, ns_eps)
        w = (k_ql @ pinv @ k_lk).abs()
        return w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    # core_periphery
    if cores is None:
        side = max(1, round(math.sqrt(num_cores)))
        cell = max(1, math.ceil(max(hw) / side))
        q_c, k_c = _pool_grid(q, hw, cell), _pool_grid(k, hw, cell)
    else:
        q_c, k_c = cores
    to_cores = ((qs @ k_c.transpose(-2, -1)) * scale).softmax(-1)  # [B, h, R, C]
    # a core reads cores and patches; keep its weights on the patches (renormalised) so the
    # two hops give a distribution over the N patches
    keys = torch.cat([k_c, k], dim=2)  # [B, h, C + N, D]
    from_cores = ((q_c @ keys.transpose(-2, -1)) * scale).softmax(-1)[..., k_c.shape[2]:]
    from_cores = from_cores / from_cores.sum(-1, keepdim=True)  # [B, h, C, N]
    return to_cores @ from_cores


def dispersion_stats(p: torch.Tensor) -> Dict[str, float]:
    """Means over all rows of ``p [..., N]`` (each row a distribution): entropy (nats),
    normalized entropy ``H / log N``, max weight, effective keys ``exp(H)`` and its fraction
    of N."""
    p = p.double()
    N = p.shape[-1]
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
    eff = ent.exp()
    return dict(entropy=ent.mean().item(),
                normalized_entropy=(ent / math.log(N)).mean().item() if N > 1 else 0.,
                max_weight=p.amax(-1).mean().item(), effective_keys=eff.mean().item(),
                effective_fraction=(eff / N).mean().item(), tokens=N)


def kinds_available() -> Sequence[str]:
    """The kinds whose ops this installation has (Laplacian-Nystrom needs its references)."""
    import mmeffattn.ops as ops
    have_lap = hasattr(ops, 'laplacian_kernel_naive') and hasattr(ops, 'newton_schulz_pinv_naive')
    return [k for k in KINDS if k != 'laplacian_nystrom' or have_lap]

