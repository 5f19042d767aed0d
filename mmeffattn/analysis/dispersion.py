"""How spread out attention weights are, per query, for each attention kind (SEMA's argument:
global softmax *disperses* as ``N`` grows, entropy ~ ``log N``).

:func:`implied_weights` gives each kind's weights (rows sum to 1) from real queries and keys,
:func:`dispersion_stats` summarises them; :func:`find_attention`, :func:`capture`,
:func:`layer_grid` and :func:`project_qk` probe a model's own attention layer for them.
"""
import math
from functools import partial
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import laplacian_kernel, newton_schulz_pinv_naive

__all__ = ['KINDS', 'implied_weights', 'dispersion_stats', 'sample_queries', 'window_weights',
           'find_attention', 'capture', 'layer_grid', 'project_qk']


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
    """The two-hop weight ``sum_c A[i, c] B[c, j]`` (patch -> core -> patch softmaxes); without
    a VECA model's ``cores``, the tokens average pooled to a ``sqrt(C) x sqrt(C)`` grid."""
    scale = q.shape[-1] ** -0.5
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    if cores is None:
        side = max(1, round(math.sqrt(num_cores)))
        cell = max(1, math.ceil(max(hw) / side))
        from mmeffattn.models.layers.nystrom import pool_landmarks
        q_c, k_c = pool_landmarks(q, hw, cell), pool_landmarks(k, hw, cell)
    else:
        q_c, k_c = cores
    to_cores = ((qs @ k_c.transpose(-2, -1)) * scale).softmax(-1)  # [B, h, R, C]
    # a core reads cores and patches: its weights on the patches, renormalised
    keys = torch.cat([k_c, k], dim=2)  # [B, h, C + N, D]
    from_cores = ((q_c @ keys.transpose(-2, -1)) * scale).softmax(-1)[..., k_c.shape[2]:]
    from_cores = from_cores / from_cores.sum(-1, keepdim=True)  # [B, h, C, N]
    return to_cores @ from_cores


def _laplacian_nystrom_weights(q, k, hw, rows, landmark_cell: int = 8, lam: float = 4.,
                               ns_iters: int = 20, ns_eps: float = 0.01,
                               **_: Any) -> torch.Tensor:
    """``K(q, L) pinv(K(L, L)) K(L, k)`` (landmarks as LaplacianFormer's first stage) as
    ``|w_ij| / sum_j |w_ij|``: Nystrom weights may be negative."""
    from mmeffattn.models.layers.nystrom import nystrom_attention, pool_landmarks
    w = nystrom_attention(q[:, :, rows.to(q.device)], pool_landmarks(q, hw, landmark_cell),
                          partial(laplacian_kernel, lam=lam),
                          lambda a, r: newton_schulz_pinv_naive(a, ns_iters, ns_eps) @ r,
                          k=k).abs()  # [B, h, R, N]
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


# -- probing a model's attention layer --
def find_attention(model: nn.Module, name: Optional[str] = None) -> Tuple[str, nn.Module]:
    """The attention module to probe: ``name``, or the first with ``num_heads`` and q/k."""
    modules = dict(model.named_modules())
    if name is not None:
        if name not in modules:
            raise ValueError(f'layer {name!r} is not a module of the model; attention-like '
                             f'modules: {[n for n, m in modules.items() if _has_qk(m)][:10]}')
        return name, modules[name]
    for n, m in modules.items():
        if _has_qk(m):
            return n, m
    raise ValueError('no module with num_heads and a q/k projection (qk, qkv, or q [and k]) '
                     'was found; name the layer to probe')


def _has_qk(m: nn.Module) -> bool:
    return hasattr(m, 'num_heads') and any(isinstance(getattr(m, a, None), nn.Linear)
                                           for a in ('qk', 'qkv', 'q'))


def project_qk(attn: nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The layer's own queries and keys ``[B, h, L, D]`` for its input tokens ``x [B, L, C]``
    (before any RoPE or feature map: every kind then weighs the same q and k)."""
    B, L, C = x.shape
    if isinstance(getattr(attn, 'qk', None), nn.Linear):
        q, k = attn.qk(x).chunk(2, dim=-1)
    elif isinstance(getattr(attn, 'qkv', None), nn.Linear):
        q, k, _ = attn.qkv(x).chunk(3, dim=-1)
    elif isinstance(getattr(attn, 'k', None), nn.Linear):
        q, k = attn.q(x), attn.k(x)
    else:  # LaplacianFormer: the queries are also the keys
        q = k = attn.q(x)
    nh = attn.num_heads
    return tuple(t.reshape(B, L, nh, -1).transpose(1, 2) for t in (q, k))  # type: ignore


class _Stop(Exception):
    pass


def capture(model: nn.Module, attn: nn.Module, x: torch.Tensor,
            stop: bool = False) -> Dict[str, Any]:
    """Run ``model(x)`` (the ops' PyTorch backend, no grad) and return the probed layer's first
    call: ``x`` (its input tokens), ``args`` and ``kwargs``; ``stop`` ends the forward there."""
    from mmeffattn.ops import use_backend
    got: Dict[str, Any] = {}

    def hook(module, args, kwargs):
        if 'x' not in got:
            got.update(x=args[0].detach(), args=args[1:], kwargs=dict(kwargs))
        if stop:
            raise _Stop

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad(), use_backend('torch'):  # (not the Triton interpreter on a CPU)
            model(x)
    except _Stop:
        pass
    finally:
        handle.remove()
    if 'x' not in got:
        raise RuntimeError('the probed attention layer was not called by the forward')
    return got


def layer_grid(got: Dict[str, Any], image_hw: Tuple[int, int],
               patch: int) -> Tuple[Tuple[int, int], int]:
    """``(hw, num_cores)`` of the call that :func:`capture` took: the ``hw`` argument our blocks
    pass, VECA's core count (its last argument), or a square grid."""
    n = got['x'].shape[1]
    args = got['args']
    if args and isinstance(args[0], (tuple, list)) and len(args[0]) == 2:
        return (int(args[0][0]), int(args[0][1])), 0
    if len(args) >= 3 and isinstance(args[-1], int):  # VECA: (cos, sin, num_cores)
        hw = (math.ceil(image_hw[0] / patch), math.ceil(image_hw[1] / patch))
        return hw, args[-1]
    side = int(round(math.sqrt(n)))
    if side * side != n:
        raise ValueError(f'cannot tell the token grid of {n} tokens; probe a layer that gets '
                         f'(x, hw)')
    return (side, side), 0
