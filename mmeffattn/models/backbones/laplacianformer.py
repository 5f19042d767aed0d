"""LaplacianFormer: Nystrom linear attention with a Laplacian kernel, as an OpenMMLab backbone.

Paper: LaplacianFormer (Feng et al.), ICLR 2026, arXiv 2604.20368; baseline SOFT (NeurIPS 2021).
``out = K(Q, L) (K(L, L) + eps I)^-1 K(L, Q) V / N + DWC(V)``, ``k(x, y) = exp(-||x - y||_1 /
lam)``, in a PVTv2 pyramid. Design choices: docs/design/laplacianformer.md.
"""
from functools import partial
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import compute_dtype, laplacian_kernel, newton_schulz_pinv
from mmeffattn.ops.newton_schulz import BACKWARDS as NS_BACKWARDS
from mmeffattn.registry import MODELS
from ..layers import DropPath, Mlp
from ..layers.heads import check_heads
from ..layers.kernel_whitening import KernelWhitening
from ..layers.linear_solve import conjugate_gradient_solve
from ..layers.nystrom import nystrom_attention, pool_landmarks
from ..layers.recompute import is_recomputing
from ..layers.tokens import map_to_tokens, tokens_to_map
from ..utils import init_linear_and_norm
from .base import BaseBackbone, HWShape, drop_path_rates, run_block

__all__ = ['LaplacianFormer', 'LaplacianAttention', 'SoftmaxAttention', 'DiagonalWhitening',
           'gaussian_kernel', 'landmark_cell']

KERNELS = ('laplacian', 'gaussian')
WHITENINGS = ('kernel', 'query', None)
WHITENING_STATS = ('per_landmark', 'per_head')
PINV_SOLVERS = ('newton_schulz', 'cg')
FEATURE_SCALES = ('sqrt_head_dim', )  # named scales (besides None and positive numbers)


def resolve_whitening(whitening: Optional[str]) -> Optional[str]:
    """``whitening`` checked against :data:`WHITENINGS`."""
    if whitening not in WHITENINGS:
        raise ValueError(f"whitening must be one of {WHITENINGS} ('kernel': the paper's map on "
                         f"the kernel similarities; 'query': DiagonalWhitening on the queries, an "
                         f"ablation; None: off), got {whitening!r}")
    return whitening


def check_feature_scale(feature_scale: Union[float, str, None]) -> None:
    """Raise ValueError unless ``feature_scale`` is None, a positive number or a named scale."""
    if feature_scale is None or feature_scale in FEATURE_SCALES:
        return
    if isinstance(feature_scale, bool) or not isinstance(feature_scale, (int, float)) or \
            not feature_scale > 0:
        raise ValueError(f'feature_scale must be None (no scaling: lam is the bandwidth on the '
                         f'projected features), a positive number, or one of {FEATURE_SCALES} '
                         f'(head_dim ** -0.5 per stage, the scaling of models trained before '
                         f'whitening=\'kernel\'), got {feature_scale!r}')


def _check_solver_args(whitening_stats: str, landmark_grid: int, pinv_solver: str,
                       cg_iters: int, cg_tol: float, ns_backward: str) -> None:
    """Raise ValueError naming the accepted values of the whitening-statistics and solver
    arguments."""
    if whitening_stats not in WHITENING_STATS:
        raise ValueError(f"whitening_stats must be one of {WHITENING_STATS} ('per_landmark' pools "
                         f"the landmarks to a fixed grid; 'per_head' works with any landmark "
                         f"count), got {whitening_stats!r}")
    if isinstance(landmark_grid, bool) or not isinstance(landmark_grid, int) or landmark_grid < 1:
        raise ValueError(f'landmark_grid must be an integer >= 1 (7: the 224x224 landmark cells),'
                         f' got {landmark_grid!r}')
    if pinv_solver not in PINV_SOLVERS:
        raise ValueError(f'pinv_solver must be one of {PINV_SOLVERS}, got {pinv_solver!r}')
    if ns_backward not in NS_BACKWARDS:
        raise ValueError(f"ns_backward must be one of {NS_BACKWARDS} ('implicit': the official "
                         f"operator's -V^T G V^T; 'unrolled': through every Newton-Schulz step), "
                         f"got {ns_backward!r}")
    if isinstance(cg_iters, bool) or not isinstance(cg_iters, int) or cg_iters < 1:
        raise ValueError(f'cg_iters must be an integer >= 1, got {cg_iters!r}')
    if isinstance(cg_tol, bool) or not isinstance(cg_tol, (int, float)) or not cg_tol >= 0:
        raise ValueError(f'cg_tol must be a number >= 0 (0 runs all cg_iters), got {cg_tol!r}')


def landmark_cell(hw: HWShape, sr: int, max_landmarks: Optional[int] = None) -> int:
    """The landmark cell side: ``sr``, grown to the smallest side whose grid of
    ``ceil(H / side) * ceil(W / side)`` cells holds at most ``max_landmarks`` (None: no cap)."""
    if max_landmarks is None:
        return sr
    side = sr
    while -(-hw[0] // side) * -(-hw[1] // side) > max_landmarks:
        side += 1
    return side


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SOFT's Gaussian kernel ``exp(-||x_i - y_j||_2^2 / 2)`` by matmuls, ``[..., N, D] x [..., M,
    D] -> [..., N, M]`` (the squared distance clamped at 0 against rounding).
    """
    sq = (x * x).sum(-1, keepdim=True) + (y * y).sum(-1).unsqueeze(-2)  # [..., N, M]
    dist = (sq - 2 * x @ y.transpose(-2, -1)).clamp_min(0)
    return torch.exp(-0.5 * dist)


class DiagonalWhitening(nn.Module):
    """``z = Sigma^{-1/2} (x - mean) + bias`` per channel (BatchNorm without scale, float32 inside):
    the query whitening ablation. Not a ``_BatchNorm``, so ``convert_sync_batchnorm`` leaves it
    alone.
    """

    #: batch statistics with running estimates: ``norm_eval`` keeps it in eval mode
    running_statistics = True

    def __init__(self, dim: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.momentum = momentum
        self.eps = eps
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer('running_mean', torch.zeros(dim))
        self.register_buffer('running_var', torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., C]; statistics over every leading position
        flat = x.reshape(-1, self.dim).to(compute_dtype(x.dtype))  # [B*N, C]
        if self.training and flat.shape[0] < 2:
            raise ValueError(f'{self.__class__.__name__} needs at least 2 tokens per batch in '
                             f'training to estimate a variance, got {flat.shape[0]}; use a '
                             f'larger input or batch, or eval mode (running statistics)')
        mean, var = self.running_mean, self.running_var
        recomputing = self.training and is_recomputing()
        if recomputing or mean.dtype != flat.dtype:
            # throw-away copies: a recomputed (checkpointed) pass must not count its batch twice,
            # and a half-precision model's estimates are updated in float32, then stored back
            mean, var = mean.to(flat.dtype, copy=True), var.to(flat.dtype, copy=True)
        z = F.batch_norm(flat, mean, var, None, self.bias.to(flat.dtype), self.training,
                         self.momentum, self.eps)
        if self.training and not recomputing and mean.data_ptr() != self.running_mean.data_ptr():
            with torch.no_grad():
                self.running_mean.copy_(mean)
                self.running_var.copy_(var)
        return z.reshape(x.shape)

    def extra_repr(self) -> str:
        return f'{self.dim}, momentum={self.momentum}, eps={self.eps}'


class LaplacianAttention(nn.Module):
    """Nystrom kernel attention: landmarks, an inverse (Newton-Schulz or CG) and a DWC branch.

    ``out = proj(S (K(L, L) + eps I)^-1 K(L, Z) V / N + DWC(V))``, ``Z`` the projected queries (also
    the keys), ``L`` the pooled landmarks, ``S = K(Z, L)`` kernel-whitened by default. Under
    autocast the Nystrom term stays float32 (Newton-Schulz does not converge and L1 distances lose
    percents in 16 bits); the projections and the DWC follow autocast.

    Args:
        dim, num_heads: channels and heads (``dim % num_heads == 0``).
        sr_ratio: landmark cell side.
        kernel, lam: ``'laplacian'`` (bandwidth ``lam``) or ``'gaussian'`` (SOFT's).
        ns_iters, ns_backward: Newton-Schulz iterations; backward ``'implicit'``/``'unrolled'``.
        eps: ridge added to ``K(L, L)``.
        whitening: ``'kernel'`` (the paper's), ``'query'`` (ablation) or None.
        whitening_stats, landmark_grid: ``'per_landmark'`` (fixed landmark grid) or ``'per_head'``.
        feature_scale: None, a positive number or ``'sqrt_head_dim'``.
        pinv_solver, cg_iters, cg_tol: ``'newton_schulz'`` or ``'cg'`` and its stopping rule.
        max_landmarks: landmark cap (larger grids pool larger cells); None: no cap.
        dwc_kernel, qkv_bias: side of the depthwise value convolution; bias of the projections.
        backend: backend of the ops (None: automatic).
    """

    def __init__(self, dim: int, num_heads: int, sr_ratio: int = 1, kernel: str = 'laplacian',
                 lam: float = 4., ns_iters: int = 20, ns_backward: str = 'implicit',
                 eps: float = 0.01, whitening: Optional[str] = 'kernel',
                 whitening_stats: str = 'per_landmark', landmark_grid: int = 7,
                 feature_scale: Union[float, str, None] = None,
                 pinv_solver: str = 'newton_schulz', cg_iters: int = 20, cg_tol: float = 1e-6,
                 max_landmarks: Optional[int] = None, dwc_kernel: int = 3, qkv_bias: bool = True,
                 backend: Optional[str] = None) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')
        if dwc_kernel % 2 != 1:
            raise ValueError(f'dwc_kernel must be odd (same-size output), got {dwc_kernel}')
        whitening = resolve_whitening(whitening)
        _check_solver_args(whitening_stats, landmark_grid, pinv_solver, cg_iters, cg_tol,
                           ns_backward)
        check_feature_scale(feature_scale)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.sr_ratio = sr_ratio
        self.kernel = kernel
        self.lam = float(lam)
        self.ns_iters, self.ns_backward = ns_iters, ns_backward
        self.eps = float(eps)
        self.whitening = whitening
        self.whitening_stats = whitening_stats
        self.pinv_solver = pinv_solver
        self.cg_iters, self.cg_tol = cg_iters, float(cg_tol)
        self.max_landmarks = max_landmarks
        self.backend = backend
        # per-slot statistics need a fixed landmark count: pool to a fixed grid then
        self.landmark_grid = landmark_grid if (
            whitening == 'kernel' and whitening_stats == 'per_landmark') else None
        self.feature_scale = feature_scale
        scale = 1. if feature_scale is None else (
            self.head_dim ** -0.5 if feature_scale == 'sqrt_head_dim' else float(feature_scale))
        # SOFT's Gaussian kernel squares the distance and has no bandwidth: it keeps its own
        # head_dim ** -0.25 on each side; the Laplacian's bandwidth is lam (no implicit scale)
        self.scale = scale * (self.head_dim ** -0.25 if kernel == 'gaussian' else 1.)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)  # queries, also the keys (SOFT)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        # the names stay: 'whiten' (query) loads checkpoints from before 'kernel' existed
        self.whiten = DiagonalWhitening(dim) if whitening == 'query' else None
        self.kwhiten = KernelWhitening(
            num_heads, landmark_grid ** 2 if self.landmark_grid else None) \
            if whitening == 'kernel' else None
        self.dwc = nn.Conv2d(dim, dim, dwc_kernel, padding=dwc_kernel // 2, groups=dim)
        self.proj = nn.Linear(dim, dim)

    def features(self, q: torch.Tensor) -> torch.Tensor:
        """The kernel's input from the projected queries: ``[B, N, C]`` -> ``[B, heads, N,
        head_dim]``, query-whitened (``whitening='query'``) and scaled (if a scale applies);
        float32 for 16-bit inputs."""
        B, N, _ = q.shape
        q = self.whiten(q) if self.whiten is not None else q.to(compute_dtype(q.dtype))
        q = q.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        return q * self.scale if self.scale != 1. else q

    def kernel_fn(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[B, h, N, D]``, ``[B, h, M, D]`` -> ``[B, h, N, M]`` kernel matrix."""
        if self.kernel == 'laplacian':
            return laplacian_kernel(x, y, self.lam, backend=self.backend)
        return gaussian_kernel(x, y)

    def landmarks(self, z: torch.Tensor, hw: HWShape) -> torch.Tensor:
        """``[B, h, N, D]`` -> ``[B, h, M, D]``: a fixed grid (per-landmark kernel whitening) or
        ``sr x sr`` cells (capped by ``max_landmarks``)."""
        if self.landmark_grid is not None:
            return pool_landmarks(z, hw, grid=self.landmark_grid)
        return pool_landmarks(z, hw, landmark_cell(hw, self.sr_ratio, self.max_landmarks))

    def solve(self, k_ll: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``(K(L, L) + eps I)^-1 R`` for ``k_ll [B, h, M, M]``, ``r [B, h, M, Dv]``."""
        if self.pinv_solver == 'cg':
            return conjugate_gradient_solve(k_ll, r, self.eps, iters=self.cg_iters,
                                            tol=self.cg_tol)
        return newton_schulz_pinv(k_ll, self.ns_iters, self.eps, backward=self.ns_backward,
                                  backend=self.backend) @ r

    def kernel_whiten(self, s: torch.Tensor, update_stats: bool) -> torch.Tensor:
        """:class:`KernelWhitening` of ``s [B, h, N, M]`` (float32). A half-precision model
        (``model.half()``) holds 16-bit running estimates while the statistics are float32: run
        on float32 copies and store them back (as :class:`DiagonalWhitening` does)."""
        wh = self.kwhiten
        if wh.running_mean.dtype == s.dtype:
            return wh(s, update_stats=update_stats)
        mean, var = wh.running_mean, wh.running_var
        wh.running_mean, wh.running_var = mean.to(s.dtype), var.to(s.dtype)
        try:
            return wh(s, update_stats=update_stats)
        finally:
            if wh.training and update_stats:
                with torch.no_grad():
                    mean.copy_(wh.running_mean)
                    var.copy_(wh.running_var)
            wh.running_mean, wh.running_var = mean, var

    def nystrom(self, z: torch.Tensor, v: torch.Tensor, hw: HWShape) -> torch.Tensor:
        """``S (K(L, L) + eps I)^-1 K(L, z) v / N`` for ``z`` ``[B, h, N, D]``, ``v`` ``[B, h, N,
        Dv]`` (float32), ``S = K(z, L)`` kernel-whitened (``whitening='kernel'``, the query-side
        factor only: docs/design/laplacian_whitening.md, section 1) or raw."""
        # a gradient-checkpoint recomputation must not count the batch twice
        whiten = None if self.kwhiten is None else partial(
            self.kernel_whiten, update_stats=not is_recomputing())
        return nystrom_attention(z, self.landmarks(z, hw), self.kernel_fn, self.solve, v,
                                 whiten=whiten)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        q, v = self.q(x), self.v(x)  # [B, N, C] each
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = self.features(q)  # float32 under autocast (docs/design/laplacianformer.md)
            vh = v.to(z.dtype).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
            out = self.nystrom(z, vh, hw)  # [B, h, N, hd]
        # added into the DWC's fresh output (its backward does not need it) through strides
        y = map_to_tokens(self.dwc(tokens_to_map(v, hw)))  # [B, N, C]
        y.unflatten(-1, (self.num_heads, self.head_dim)).add_(out.to(y.dtype).transpose(1, 2))
        return self.proj(y)

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, num_heads={self.num_heads}, sr_ratio={self.sr_ratio}, '
                f'kernel={self.kernel!r}, lam={self.lam}, feature_scale={self.feature_scale!r}, '
                f'whitening={self.whitening!r}, landmark_grid={self.landmark_grid}, '
                f'pinv_solver={self.pinv_solver!r}, ns_iters={self.ns_iters}, '
                f'ns_backward={self.ns_backward!r}, eps={self.eps}, '
                f'max_landmarks={self.max_landmarks}')


class SoftmaxAttention(nn.Module):
    """Ordinary multi-head softmax attention over all tokens (SOFT's and PVTv2's last stage)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        nh, hd = self.num_heads, C // self.num_heads
        q = self.q(x).reshape(B, N, nh, hd).transpose(1, 2)  # [B, nh, N, hd]
        k, v = self.kv(x).reshape(B, N, 2, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, nh, N, hd]
        return self.proj(out.transpose(1, 2).reshape(B, N, C))

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}'


class ConvMlp(Mlp):
    """PVTv2's MLP: ``fc1 -> 3x3 depthwise conv on the token grid -> act -> fc2``."""

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.) -> None:
        super().__init__(in_features, hidden_features, act_cfg=dict(type='GELU'), drop=drop)
        self.dwconv = nn.Conv2d(hidden_features, hidden_features, 3, padding=1,
                                groups=hidden_features)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        x = self.fc1(x)  # [B, N, hidden]
        x = self.drop(self.act(map_to_tokens(self.dwconv(tokens_to_map(x, hw)))))
        return self.drop(self.fc2(x))  # [B, N, C]


class LaplacianBlock(nn.Module):
    """Pre-norm block ``x + drop_path(attn(LN(x)))``, ``x + drop_path(mlp(LN(x)))``; ``attn``:
    ``'kernel'`` (:class:`LaplacianAttention` with ``attn_kwargs``) or ``'softmax'``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., attn: str = 'kernel',
                 qkv_bias: bool = True, drop: float = 0., drop_path: float = 0.,
                 **attn_kwargs) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        if attn == 'softmax':
            self.attn = SoftmaxAttention(dim, num_heads, qkv_bias)
        else:
            self.attn = LaplacianAttention(dim, num_heads, qkv_bias=qkv_bias, **attn_kwargs)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        # x: [B, N, C], N = H * W; the residuals are added into the branches' fresh outputs (a
        # Linear's or DropPath's, whose backward does not need them)
        x = self.drop_path(self.attn(self.norm1(x), hw)).add_(x)
        return self.drop_path(self.mlp(self.norm2(x), hw)).add_(x)


class OverlapPatchEmbed(nn.Module):
    """PVTv2's overlapping patch embedding: ``k x k`` conv, stride ``s``, padding ``k // 2``, then
    LayerNorm. Any ``H x W`` works: the output grid is ``ceil(H / s) x ceil(W / s)``."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=stride,
                              padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dims, eps=1e-6)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, HWShape]:
        # channels-last in (the image; later stages' maps already are): the tokens out are a view
        x = self.proj(x.contiguous(memory_format=torch.channels_last))  # [B, C, H', W']
        hw = (x.shape[2], x.shape[3])
        return self.norm(map_to_tokens(x)), hw


class LaplacianStage(nn.Module):
    """A PVTv2 stage: overlapping patch embedding (stride ``patch_size // 2 + 1``), ``depth``
    blocks, closing LayerNorm.
    """

    def __init__(self, in_channels: int, dim: int, depth: int, patch_size: int,
                 drop_path: Sequence[float], with_cp: bool = False, **block_kwargs) -> None:
        super().__init__()
        self.with_cp = with_cp
        self.patch_embed = OverlapPatchEmbed(in_channels, dim, patch_size,
                                             stride=patch_size // 2 + 1)
        self.blocks = nn.ModuleList(
            [LaplacianBlock(dim, drop_path=drop_path[i], **block_kwargs) for i in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, H, W]`` -> ``[B, C, ceil(H / s), ceil(W / s)]``, a channels-last view of
        the tokens (oneDNN's layout: the next patch embedding reads it without a reorder)."""
        x, hw = self.patch_embed(x)  # [B, N, C]
        for blk in self.blocks:
            x = run_block(blk, x, hw, with_cp=self.with_cp)
        return tokens_to_map(self.norm(x), hw)


@MODELS.register_module()
class LaplacianFormer(BaseBackbone):
    """LaplacianFormer backbone: a PVTv2 pyramid with Laplacian-kernel Nystrom attention.

    Stage ``i`` runs at stride ``4 * 2**i``; its closing LayerNorm feeds the next stage and is its
    output norm. Returns one NCHW map per ``out_indices`` entry, for any input size.

    Args:
        arch: ``'tiny'``/``'t'``, ``'small'``/``'s'`` or a dict of ``embed_dims``, ``depths``,
            ``num_heads`` (optionally ``mlp_ratios``, ``sr_ratios``).
        in_channels: image channels.
        kernel, lam, ns_iters, ns_backward, eps: as :class:`LaplacianAttention`.
        whitening, whitening_stats, landmark_grid, feature_scale: as :class:`LaplacianAttention`.
        pinv_solver, cg_iters, cg_tol, max_landmarks: as :class:`LaplacianAttention`
            (``max_landmarks=128``: the official CUDA inverse's limit).
        softmax_last_stage: softmax attention in the last stage (as SOFT).
        dwc_kernel_sizes: depthwise value-conv side per kernel stage (SOFT: 9, 5, 3).
        qkv_bias, drop_rate, drop_path_rate: projection bias, MLP dropout, stochastic depth.
        out_indices, frozen_stages, norm_eval, with_cp, init_cfg: the OpenMMLab switches
            (``norm_eval`` also freezes the whitening statistics).
        attn_backend: backend of the ops.
    """

    # widths are ours, fitted to the paper's parameters and FLOPs (docs/design/laplacianformer.md)
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], {
            'embed_dims': [64, 128, 320, 512], 'depths': [2, 2, 2, 2],
            'num_heads': [1, 2, 5, 8], 'mlp_ratios': [6, 8, 4, 4], 'sr_ratios': [8, 4, 2, 1]}),
        **dict.fromkeys(['s', 'small'], {
            'embed_dims': [64, 128, 320, 512], 'depths': [3, 4, 8, 4],
            'num_heads': [1, 2, 5, 8], 'mlp_ratios': [6, 8, 4, 4], 'sr_ratios': [8, 4, 2, 1]}),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    arch_defaults = dict(mlp_ratios=[6, 8, 4, 4], sr_ratios=[8, 4, 2, 1])  # tiny's
    mini_arch = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 2],
                     mlp_ratios=[2, 2, 2, 2], sr_ratios=[8, 4, 2, 1])

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 kernel: str = 'laplacian',
                 lam: float = 4.,
                 ns_iters: int = 20,
                 ns_backward: str = 'implicit',
                 eps: float = 0.01,
                 whitening: Optional[str] = 'kernel',
                 whitening_stats: str = 'per_landmark',
                 landmark_grid: int = 7,
                 feature_scale: Union[float, str, None] = None,
                 pinv_solver: str = 'newton_schulz',
                 cg_iters: int = 20,
                 cg_tol: float = 1e-6,
                 softmax_last_stage: bool = True,
                 max_landmarks: Optional[int] = 128,
                 dwc_kernel_sizes: Sequence[int] = (9, 5, 3, 3),
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 attn_backend: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(arch, in_channels, init_cfg)
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or lam <= 0:
            raise ValueError(f'lam must be a positive number (paper default 4), got {lam!r}')
        if isinstance(ns_iters, bool) or not isinstance(ns_iters, int) or ns_iters < 0:
            raise ValueError(f'ns_iters must be an integer >= 0 (SOFT uses 20), got {ns_iters!r}')
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f'eps must be a number >= 0 (official 0.01), got {eps!r}')
        if max_landmarks is not None and (isinstance(max_landmarks, bool) or not isinstance(
                max_landmarks, int) or max_landmarks < 1):
            raise ValueError(f'max_landmarks must be None or an integer >= 1 (official CUDA '
                             f'inverse: 128), got {max_landmarks!r}')
        whitening = resolve_whitening(whitening)
        _check_solver_args(whitening_stats, landmark_grid, pinv_solver, cg_iters, cg_tol,
                           ns_backward)
        check_feature_scale(feature_scale)
        embed_dims = self.arch_settings['embed_dims']
        depths = self.arch_settings['depths']
        self.num_layers = len(depths)
        if len(dwc_kernel_sizes) < self.num_layers:
            raise ValueError(f'dwc_kernel_sizes {tuple(dwc_kernel_sizes)} needs one entry per '
                             f'stage ({self.num_layers})')
        self.kernel = kernel
        self.lam, self.ns_iters, self.eps = float(lam), ns_iters, float(eps)
        self.ns_backward = ns_backward
        self.whitening, self.whitening_stats = whitening, whitening_stats
        self.feature_scale, self.pinv_solver = feature_scale, pinv_solver
        self.num_features = list(embed_dims)
        self._init_training_switches(out_indices, self.num_layers, 'stages', frozen_stages,
                                     norm_eval, with_cp)

        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.num_layers):
            start = sum(depths[:i])
            softmax = softmax_last_stage and i == self.num_layers - 1
            attn_kwargs = {} if softmax else dict(
                sr_ratio=self.arch_settings['sr_ratios'][i], kernel=kernel, lam=self.lam,
                ns_iters=ns_iters, ns_backward=ns_backward, eps=self.eps, whitening=whitening,
                whitening_stats=whitening_stats, landmark_grid=landmark_grid,
                feature_scale=feature_scale, pinv_solver=pinv_solver, cg_iters=cg_iters,
                cg_tol=cg_tol, max_landmarks=max_landmarks, dwc_kernel=dwc_kernel_sizes[i],
                backend=attn_backend)
            self.layers.append(LaplacianStage(
                in_channels if i == 0 else embed_dims[i - 1], embed_dims[i], depths[i],
                patch_size=7 if i == 0 else 3, drop_path=dpr[start:start + depths[i]],
                with_cp=with_cp, num_heads=self.arch_settings['num_heads'][i],
                mlp_ratio=self.arch_settings['mlp_ratios'][i],
                attn='softmax' if softmax else 'kernel', qkv_bias=qkv_bias, drop=drop_rate,
                **attn_kwargs))

        self.apply(init_linear_and_norm)
        self._freeze_stages()

    @classmethod
    def _check_arch(cls, arch: dict) -> dict:
        scalars = sorted(k for k, v in arch.items() if not isinstance(v, (list, tuple)))
        if scalars:
            raise ValueError(f'arch {scalars} must be lists with one entry per stage, got '
                             f'{ {k: arch[k] for k in scalars} }')
        arch = {k: list(v) for k, v in arch.items()}
        lengths = {k: len(v) for k, v in arch.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f'arch lists must have one entry per stage, got lengths {lengths}')
        for c, h in zip(arch['embed_dims'], arch['num_heads']):
            if c % h:
                raise ValueError(f'arch embed_dims {arch["embed_dims"]} not divisible by '
                                 f'num_heads {arch["num_heads"]}')
        return arch

    def frozen_modules(self) -> List[nn.Module]:
        """The first patch embedding, and the first ``frozen_stages`` stages whole."""
        return [self.layers[0].patch_embed] + [self.layers[i] for i in range(self.frozen_stages)]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Args: x: ``[B, in_channels, H, W]``, any ``H, W >= 1``.

        Returns:
            One ``[B, embed_dims[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2))]`` map per ``i`` in
            ``out_indices`` (``ceil`` applied at each stride step).
        """
        self.check_input(x)
        outs = []
        for i, layer in enumerate(self.layers[:self.out_indices[-1] + 1]):  # none unused after
            x = layer(x)  # [B, C_i, H_i, W_i]
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    prefix_probe = 'layers.0.patch_embed.proj.weight'
    checkpoint_signature = (r'(^|\.)layers\.\d+\.blocks\.\d+\.attn\.'
                            r'(whiten\.bias|kwhiten\.bias|kv\.weight)$')

    def describe(self) -> str:
        return (f'{self.__class__.__name__}(arch={self.arch_settings}, kernel={self.kernel!r}, '
                f'whitening={self.whitening!r}, feature_scale={self.feature_scale!r}, '
                f'pinv_solver={self.pinv_solver!r})')
