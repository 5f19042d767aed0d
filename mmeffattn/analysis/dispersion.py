"""How spread out attention weights are, per query, for each attention kind (SEMA's argument).

SEMA argues that global softmax attention *disperses* as ``N`` grows (entropy ~ ``log N``, the
top weight shrinks); windows keep a fixed key count and SEMA adds the global mean explicitly.
:func:`implied_weights` gives each kind's weights ``p[i, j]`` (rows sum to 1) from real queries
and keys; :func:`dispersion_stats` summarises rows (entropy, entropy / ``log N``, top weight,
``exp(entropy)`` keys). Kinds: ``softmax``, ``linear`` (ELU + 1), ``window``, ``sema``,
``core_periphery`` (two softmax hops) and ``laplacian_nystrom``.
"""
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from mmeffattn.ops import laplacian_kernel, newton_schulz_pinv_naive

__all__ = ['KINDS', 'implied_weights', 'dispersion_stats', 'sample_queries', 'window_weights',
           'pool_grid']


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


def pool_grid(x: torch.Tensor, hw: Tuple[int, int], cell: int) -> torch.Tensor:
    """``[B, h, N, D]`` tokens of an ``H x W`` grid -> ``[B, h, M, D]`` means over cells."""
    B, nh, N, D = x.shape
    grid = x.transpose(-2, -1).reshape(B * nh, D, *hw)
    pooled = F.avg_pool2d(grid, cell, ceil_mode=True)
    return pooled.flatten(2).transpose(-2, -1).reshape(B, nh, -1, D)


def _logits(q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``[B, h, R, N]`` scaled logits of the queries ``rows`` over every key."""
    return (q[:, :, rows.to(q.device)] @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5


def window_weights(q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int], rows: torch.Tensor,
                   window: int = 7, **_: Any) -> torch.Tensor:
    """Softmax inside the query's ``window x window`` window, zero outside."""
    ids = _window_ids(hw, window, q.device)
    same = ids[rows.to(q.device)][:, None] == ids[None, :]  # [R, N]
    return _logits(q, k, rows).masked_fill(~same, float('-inf')).softmax(-1)


def _softmax_weights(q, k, hw, rows, **_: Any) -> torch.Tensor:
    return _logits(q, k, rows).softmax(-1)


def _linear_weights(q, k, hw, rows, **_: Any) -> torch.Tensor:
    fq, fk = F.elu(q[:, :, rows.to(q.device)]) + 1, F.elu(k) + 1
    w = fq @ fk.transpose(-2, -1)  # [B, h, R, N], positive
    return w / w.sum(-1, keepdim=True)


def _sema_weights(q, k, hw, rows, window: int = 7, **_: Any) -> torch.Tensor:
    """``out_i = sum_j a_ij v_j + mean_j v_j`` weighs ``v_j`` by ``a_ij + 1/N`` (total 2),
    halved to a distribution."""
    return (window_weights(q, k, hw, rows, window) + 1.0 / q.shape[2]) / 2


def _core_periphery_weights(q, k, hw, rows, num_cores: int = 16,
                            cores: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                            **_: Any) -> torch.Tensor:
    """A patch reads the C cores only; the cores read every token. The implied weight of patch
    ``j`` for patch ``i`` is the two-hop ``sum_c A[i, c] B[c, j]`` (patch -> core -> patch), with
    ``A`` the patch-to-core and ``B`` the core-to-patch softmax. Without a VECA model
    (``cores`` None) the cores are the tokens average pooled to a ``sqrt(C) x sqrt(C)`` grid."""
    scale = q.shape[-1] ** -0.5
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    if cores is None:
        side = max(1, round(math.sqrt(num_cores)))
        cell = max(1, math.ceil(max(hw) / side))
        q_c, k_c = pool_grid(q, hw, cell), pool_grid(k, hw, cell)
    else:
        q_c, k_c = cores
    to_cores = ((qs @ k_c.transpose(-2, -1)) * scale).softmax(-1)  # [B, h, R, C]
    # a core reads cores and patches; keep its weights on the patches (renormalised) so the
    # two hops give a distribution over the N patches
    keys = torch.cat([k_c, k], dim=2)  # [B, h, C + N, D]
    from_cores = ((q_c @ keys.transpose(-2, -1)) * scale).softmax(-1)[..., k_c.shape[2]:]
    from_cores = from_cores / from_cores.sum(-1, keepdim=True)  # [B, h, C, N]
    return to_cores @ from_cores


def _laplacian_nystrom_weights(q, k, hw, rows, landmark_cell: int = 8, lam: float = 4.,
                               ns_iters: int = 20, ns_eps: float = 0.01,
                               **_: Any) -> torch.Tensor:
    """``K(q, L) pinv(K(L, L)) K(L, k) / N`` (landmarks as LaplacianFormer's first stage), as
    ``|w_ij| / sum_j |w_ij|`` since Nystrom weights may be negative and need not sum to 1."""
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    lm = pool_grid(q, hw, landmark_cell)
    # the public op: its CPU backend never materialises the [M, N, D] differences (OOM at 1024 px)
    k_ql = laplacian_kernel(qs, lm, lam)  # [B, h, R, M]
    k_lk = laplacian_kernel(lm, k, lam)  # [B, h, M, N]
    pinv = newton_schulz_pinv_naive(laplacian_kernel(lm, lm, lam), ns_iters, ns_eps)
    w = (k_ql @ pinv @ k_lk).abs()
    return w / w.sum(-1, keepdim=True).clamp_min(1e-30)


#: attention kind -> ``fn(q, k, hw, rows, **options) -> [B, h, R, N]`` weights
KIND_WEIGHTS: Dict[str, Callable[..., torch.Tensor]] = dict(
    softmax=_softmax_weights, linear=_linear_weights, window=window_weights,
    sema=_sema_weights, core_periphery=_core_periphery_weights,
    laplacian_nystrom=_laplacian_nystrom_weights)
KINDS = tuple(KIND_WEIGHTS)


def implied_weights(kind: str, q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int],
                    rows: Optional[torch.Tensor] = None, **options: Any) -> torch.Tensor:
    """Weights ``[B, h, len(rows), N]`` (rows sum to 1) of the queries ``rows`` over the N keys.

    Args:
        kind: one of :data:`KINDS`.
        q, k: ``[B, h, N, D]`` queries and keys of one layer, ``N = H * W`` in row-major order.
        hw: the token grid.
        rows: query indices (default: all).
        options: ``window``; ``num_cores`` or ``cores`` (``(q_cores, k_cores)`` of a real model)
            for ``core_periphery``; ``landmark_cell``, ``lam``, ``ns_iters``, ``ns_eps``.
    """
    if kind not in KIND_WEIGHTS:
        raise ValueError(f'unknown attention kind {kind!r}; choose from {KINDS}')
    N = q.shape[2]
    if N != hw[0] * hw[1]:
        raise ValueError(f'{N} tokens do not fill the grid {hw}')
    rows = torch.arange(N) if rows is None else rows
    return KIND_WEIGHTS[kind](q, k, hw, rows, **options)


def dispersion_stats(p: torch.Tensor) -> Dict[str, float]:
    """Means over all rows of ``p [..., N]`` (each row a distribution): entropy (nats),
    normalized entropy ``H / log N``, max weight, effective keys ``exp(H)`` and its fraction
    of N."""
    p = p.double()
    p = p / p.sum(-1, keepdim=True)  # a float32 softmax over 65k keys sums to 1 +- 1e-5
    N = p.shape[-1]
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
    eff = ent.exp()
    return dict(entropy=ent.mean().item(),
                normalized_entropy=(ent / math.log(N)).mean().item() if N > 1 else 0.,
                max_weight=p.amax(-1).mean().item(), effective_keys=eff.mean().item(),
                effective_fraction=(eff / N).mean().item(), tokens=N)
