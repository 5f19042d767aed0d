"""VECA: Visual Elastic Core Attention, an isotropic ViT whose patches talk only through cores.

Paper: Elastic Attention Cores for Scalable Vision Transformers (Song et al.), arXiv 2605.12491.
``C`` learned cores (a prefix of an ordered bank) attend to everything, patches to the cores only
(:func:`mmeffattn.ops.core_periphery_attention`), with axial RoPE on learned core coordinates.
Design: docs/design/veca.md.
"""
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import core_periphery_attention
from mmeffattn.registry import MODELS
from ..layers import DropPath
from ..layers.tokens import map_to_tokens, pad_to_multiple, tokens_to_map
from ..layers.vit_pyramid import build_vit_pyramid
from ..utils import (clip_keys, init_linear_and_norm,
                     strip_key_prefix, strip_module_prefix, unwrap_state_dict)
from .base import BaseBackbone, HWShape, drop_path_rates, quarter_blocks, run_block

__all__ = ['VECA', 'RoPE2D', 'CorePeripheryAttention', 'VECABlock', 'fps_core_coords',
           'checkpoint_filter_veca_official', 'checkpoint_filter_veca']
# official nested-dropout budget weights for 8, 16, ..., 64 active cores (veca/config.py)
OFFICIAL_BUDGET_WEIGHTS = (1., 1., 2., 2., 3., 3., 4., 4.)


def farthest_point_sampling(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of ``k`` of the ``[M, 2]`` ``points`` chosen greedily far apart, starting nearest
    the origin (ties: the lowest index); ``k >= M`` returns every index."""
    M = points.shape[0]
    if k >= M:
        return torch.arange(M)
    chosen = [int(points.square().sum(1).argmin())]
    dist2 = (points - points[chosen[0]]).square().sum(1)  # [M] to the nearest chosen point
    for _ in range(1, k):
        nxt = int(dist2.argmax())
        chosen.append(nxt)
        dist2 = torch.minimum(dist2, (points - points[nxt]).square().sum(1))
    return torch.tensor(chosen)


@torch.no_grad()
def fps_core_coords(num_cores: int, pool_size: int = 1000, coord_range: float = .95,
                    seed: Optional[int] = 0) -> torch.Tensor:
    """Initial raw core coordinates ``[num_cores, 2]``: a uniform pool in ``[-r, r]^2`` thinned by
    farthest-point sampling, through ``atanh``; ``seed`` makes the bank identical on every rank."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    pool = torch.rand(pool_size, 2, generator=gen, dtype=torch.float32, device='cpu')
    pool = pool * (2 * coord_range) - coord_range  # [pool, 2] in [-r, r]
    picked = pool[farthest_point_sampling(pool, num_cores)]
    return torch.atanh(picked.clamp(-.999, .999))


def patch_centres(hw: HWShape, device: torch.device) -> torch.Tensor:
    """``[H*W, 2]`` (x, y) pixel centres of an ``H x W`` patch grid in ``[-1, 1]``, row-major."""
    H, W = hw
    # fp32 and this order of operations, as the official grid (see RoPE2D.forward)
    ys = (torch.arange(H, device=device, dtype=torch.float32) + .5) / H * 2. - 1.
    xs = (torch.arange(W, device=device, dtype=torch.float32) + .5) / W * 2. - 1.
    gy, gx = torch.meshgrid(ys, xs, indexing='ij')
    return torch.stack((gx, gy), dim=-1).reshape(-1, 2)


class RoPE2D(nn.Module):
    """2D axial rotary position tables for VECA (the official ``Rotary2D``).

    ``Dh / 4`` periods ``base ** (2 j / (Dh / 2))``, x on the first half of the channels, y on the
    second; a fraction ``p_zero_freqs`` of periods is infinite (no position). ``shift``,
    ``jitter``, ``rescale``: training-time coordinate augmentations (None: off).
    """

    def __init__(self, head_dim: int, base: float = 100., shift: Optional[float] = .08,
                 jitter: Optional[float] = None, rescale: Optional[float] = 2.,
                 p_zero_freqs: float = .125, zero_from: str = 'low') -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f'2D RoPE needs a head dim divisible by 4, got {head_dim}: choose '
                             f'embed_dims / num_heads accordingly')
        if zero_from not in ('low', 'high'):
            raise ValueError(f"rope zero_from must be 'low' or 'high', got {zero_from!r}")
        self.head_dim, self.base = head_dim, base
        self.shift, self.jitter, self.rescale = shift, jitter, rescale
        self.p_zero_freqs, self.zero_from = float(p_zero_freqs), zero_from
        n = head_dim // 4
        periods = base ** (torch.arange(n, dtype=torch.float32, device='cpu') * 2 / (head_dim // 2))
        n_zero = int(round(self.p_zero_freqs * n))
        if n_zero:
            if zero_from == 'low':
                periods[n - n_zero:] = float('inf')
            else:
                periods[:n_zero] = float('inf')
        # derived from the arguments, so not saved (the official buffer is not persistent)
        self.register_buffer('periods', periods, persistent=False)

    def augment(self, coords: torch.Tensor) -> torch.Tensor:
        """Random shift / jitter / rescale of ``[B, N, 2]`` patch coordinates in training."""
        if not self.training:
            return coords
        if self.shift is not None:
            coords = coords + coords.new_empty(2).uniform_(-self.shift, self.shift)
        if self.jitter is not None:
            m = math.log(self.jitter)
            coords = coords * coords.new_empty(2).uniform_(-m, m).exp()
        if self.rescale is not None:
            m = math.log(self.rescale)
            coords = coords * coords.new_empty(1).uniform_(-m, m).exp()
        return coords

    def forward(self, coords: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``coords [B, L, 2]`` (x, y) -> ``(cos, sin)``, each ``[B, L, head_dim]`` in fp32."""
        # fp32 and the official order of operations: bf16 would lose position detail, and the
        # angles feed back into the core coordinates, so last-bit differences grow over blocks
        coords = coords.float()
        periods = self.periods.float().to(coords.device)  # [Dh/4]; inf -> angle 0
        ang = (2 * math.pi) * coords.unsqueeze(-1) / periods  # [B, L, 2, Dh/4]
        ang = ang.repeat_interleave(2, dim=-1).flatten(-2)  # [B, L, Dh]: x pairs, then y pairs
        return ang.cos(), ang.sin()

    def extra_repr(self) -> str:
        return (f'head_dim={self.head_dim}, base={self.base}, shift={self.shift}, '
                f'jitter={self.jitter}, rescale={self.rescale}, p_zero_freqs={self.p_zero_freqs}')


class CorePeripheryAttention(nn.Module):
    """Multi-head core-periphery attention with RoPE (the official ``MaskedBiDirAttentionSDPA``
    without its dropout, 0 in every official family).
    """

    def __init__(self, dim: int, num_heads: int, backend: Optional[str] = None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'embed_dims ({dim}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.backend = backend
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                num_cores: int) -> torch.Tensor:
        # x: [B, C + N, dim], cores first; cos/sin: [B or 1, C + N, head_dim]
        B, L, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # [B, h, L, Dh]

        out = core_periphery_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                       num_cores, rope=(cos, sin), backend=self.backend)
        return self.proj(out.transpose(1, 2).reshape(B, L, dim))  # [B, L, dim]


class SwiGLUFFN(nn.Module):
    """``fc2(silu(u) * v)`` with ``(u, v) = fc1(x)`` split in halves (the official FFN)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, v = self.fc1(x).chunk(2, dim=-1)  # [..., hidden] each
        # inference: SiLU in fc1's fresh output; the product stays contiguous for fc2's addmm
        return self.fc2(F.silu(u, inplace=not torch.is_grad_enabled()) * v)


class CoreCoordUpdate(nn.Module):
    """``raw += alpha * fc(cores)``: the step that moves the core coordinates before a block."""

    def __init__(self, dim: int, alpha: float = .01) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 2)
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))

    def forward(self, raw: torch.Tensor, cores: torch.Tensor) -> torch.Tensor:
        # raw: [B, C, 2] (fp32); cores: [B, C, dim] (the residual stream, before the norm)
        delta = self.fc(cores)
        return raw + self.alpha.to(delta.dtype) * delta


class VECABlock(nn.Module):
    """A pre-LN VECA block; blocks after the first hold the core-coordinate update that runs before
    them (freezing a block freezes the step that feeds it).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop_path: float = 0.,
                 coord_update: bool = False, alpha: float = .01,
                 backend: Optional[str] = None) -> None:
        super().__init__()
        self.coord_head = CoreCoordUpdate(dim, alpha) if coord_update else None
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CorePeripheryAttention(dim, num_heads, backend)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = SwiGLUFFN(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                num_cores: int) -> torch.Tensor:
        # x: [B, C + N, dim]; the residuals are added into the branches' fresh outputs (a
        # Linear's or DropPath's, whose backward does not need them)
        x = self.drop_path(self.attn(self.norm1(x), cos, sin, num_cores)).add_(x)
        return self.drop_path(self.ffn(self.norm2(x))).add_(x)


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens (LayerNorm with ``norm``), the image zero padded on the
    bottom/right to a multiple of ``patch_size`` first.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, norm: bool) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dims) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, HWShape]:
        # channels-last into the convolution: the tokens out are a view of its output
        x = pad_to_multiple(x, self.patch_size).contiguous(memory_format=torch.channels_last)
        x = self.proj(x)  # [B, D, ceil(H/p), ceil(W/p)]
        hw = (x.shape[2], x.shape[3])
        return self.norm(map_to_tokens(x)), hw  # [B, N, D]


@torch.compiler.disable
def _sample_outside_graph(model: 'VECA') -> int:
    return model.sample_num_cores()


@MODELS.register_module()
class VECA(BaseBackbone):
    """VECA backbone: patch tokens and a bank of learned cores; patches attend to the cores only.

    ``out_type``: ``'raw'`` (official: core 0 and normed patch tokens, last block), ``'global'``
    (core 0, ``[B, D]``), ``'featmap'`` (``[B, D, Hp, Wp]``) or ``'pyramid'`` (strides 4-32).

    Args:
        arch: ``'small'``, ``'splus'``, ``'base'``, ``'large'`` (or initials) or a dict of
            ``embed_dims``, ``depth``, ``num_heads`` (``mlp_ratio``).
        num_cores: active cores in eval, a multiple of ``core_chunk`` (None: ``max_cores``).
        out_type: ``'raw'``, ``'global'``, ``'featmap'`` or ``'pyramid'``.
        in_channels, patch_size: image channels and patch side.
        max_cores, core_chunk: the bank's size and chunk (budgets are multiples of the chunk).
        nested_dropout, budget_weights: draw the active cores per training forward, with these
            weights (None: the official 1, 1, 2, 2, 3, 3, 4, 4).
        patch_norm: LayerNorm after the patch embedding (off officially).
        out_proj_dims: the official ``distill_output_dim`` (``'raw'`` only).
        rope_*: :class:`RoPE2D` options; fps_*: :func:`fps_core_coords` options.
        coord_alpha: initial step of the core-coordinate updates.
        out_indices: blocks whose outputs are returned (None: ``out_type``'s default).
        drop_path_rate: stochastic depth (not in the official code).
        frozen_stages: 0 freezes the patch embedding and bank, ``i >= 1`` also blocks ``< i``.
        norm_eval, with_cp, init_cfg: the OpenMMLab switches.
        pyramid_cfg: :class:`ViTPyramid` arguments for ``'pyramid'``.
        attn_backend: backend of :func:`mmeffattn.ops.core_periphery_attention`.
    """

    arch_zoo = {
        **dict.fromkeys(['s', 'small'], dict(embed_dims=384, depth=12, num_heads=6,
                                             mlp_ratio=2.66667)),
        **dict.fromkeys(['splus', 's+'], dict(embed_dims=384, depth=12, num_heads=6,
                                              mlp_ratio=4.0)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=768, depth=12, num_heads=12,
                                            mlp_ratio=2.66667)),
        **dict.fromkeys(['l', 'large'], dict(embed_dims=1024, depth=24, num_heads=16,
                                             mlp_ratio=2.66667)),
    }
    arch_keys = ('embed_dims', 'depth', 'num_heads')
    arch_defaults = dict(mlp_ratio=2.66667)
    mini_arch = dict(embed_dims=64, depth=3, num_heads=2)
    mini_kwargs = dict(out_type='pyramid', out_indices=-1, num_cores=16, nested_dropout=False,
                       pyramid_cfg=dict(norm_cfg=dict(type='BN')))
    out_types = ('raw', 'global', 'featmap', 'pyramid')

    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 num_cores: Optional[int] = None,
                 out_type: str = 'raw',
                 in_channels: int = 3,
                 patch_size: int = 16,
                 max_cores: int = 64,
                 core_chunk: int = 8,
                 nested_dropout: bool = True,
                 budget_weights: Optional[Sequence[float]] = None,
                 patch_norm: bool = False,
                 out_proj_dims: Optional[int] = None,
                 rope_base: float = 100.,
                 rope_shift: Optional[float] = .08,
                 rope_jitter: Optional[float] = None,
                 rope_rescale: Optional[float] = 2.,
                 rope_p_zero_freqs: float = .125,
                 rope_zero_from: str = 'low',
                 fps_pool_size: int = 1000,
                 fps_coord_range: float = .95,
                 fps_seed: Optional[int] = 0,
                 coord_alpha: float = .01,
                 out_indices: Optional[Union[int, Sequence[int]]] = None,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 pyramid_cfg: Optional[dict] = None,
                 attn_backend: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(arch, in_channels, init_cfg)
        if out_type not in self.out_types:
            raise ValueError(f'out_type must be one of {self.out_types}, got {out_type!r}')
        self.embed_dims = D = self.arch_settings['embed_dims']
        self.depth = depth = self.arch_settings['depth']
        num_heads = self.arch_settings['num_heads']
        if D % num_heads:
            raise ValueError(f'embed_dims ({D}) must be divisible by num_heads ({num_heads})')
        if core_chunk < 1 or max_cores < core_chunk or max_cores % core_chunk:
            raise ValueError(f'max_cores ({max_cores}) must be a positive multiple of core_chunk '
                             f'({core_chunk})')
        self.patch_size = patch_size
        self.out_type = out_type
        self.max_cores = max_cores
        self.core_chunk = core_chunk
        self.budgets = tuple(range(core_chunk, max_cores + 1, core_chunk))
        self.budget_weights = self._parse_budget_weights(budget_weights)
        # validated by the setter; a smaller bank than the official 64 builds without naming it
        self.num_cores = max_cores if num_cores is None else num_cores
        self.nested_dropout = nested_dropout
        # a budget drawn outside a compiled forward (draw_for_next_forward), used once
        self._drawn_num_cores: Optional[int] = None
        self._init_training_switches(self._default_out_indices(out_indices), depth, 'blocks',
                                     frozen_stages, norm_eval, with_cp)
        if out_type == 'raw' and self.out_indices != (depth - 1, ):
            raise ValueError(f"out_type='raw' returns the last block only (out_indices=None or "
                             f'({depth - 1},)), got {self.out_indices}; use out_type=\'global\' '
                             f"or 'featmap' for other blocks")

        self.patch_embed = PatchEmbed(in_channels, D, patch_size, patch_norm)
        # the bank in chunks: a forward with C cores touches only the first C / chunk of them,
        # so the others get no gradient at all (not a zero one)
        n_chunks = max_cores // core_chunk
        self.core_tokens = nn.ParameterList([
            nn.Parameter(torch.randn(1, core_chunk, D, device='cpu') / math.sqrt(D))
            for _ in range(n_chunks)])
        raw = fps_core_coords(max_cores, fps_pool_size, fps_coord_range, fps_seed)
        self.core_coords = nn.ParameterList([
            nn.Parameter(raw[c * core_chunk:(c + 1) * core_chunk].unsqueeze(0).clone())
            for c in range(n_chunks)])  # each [1, chunk, 2]
        self.rope = RoPE2D(D // num_heads, rope_base, rope_shift, rope_jitter, rope_rescale,
                           rope_p_zero_freqs, rope_zero_from)
        dpr = drop_path_rates(drop_path_rate, depth)
        self.blocks = nn.ModuleList([
            VECABlock(D, num_heads, self.arch_settings['mlp_ratio'], drop_path=dpr[i],
                      coord_update=i > 0, alpha=coord_alpha, backend=attn_backend)
            for i in range(depth)])
        self._add_out_norms(D)

        self.output_proj: Optional[nn.Linear] = None
        if out_proj_dims is not None and out_proj_dims != D:
            if out_type != 'raw':
                raise ValueError(f"out_proj_dims (the distillation output projection) is only "
                                 f"used with out_type='raw', not {out_type!r}; leave it None "
                                 f'(its checkpoint keys are then ignored)')
            self.output_proj = nn.Linear(D, out_proj_dims)
        self.pyramid = build_vit_pyramid(out_type, D, self.out_indices, pyramid_cfg)

        self._init_official()
        self._freeze_stages()

    def _parse_budget_weights(self, weights: Optional[Sequence[float]]) -> Tuple[float, ...]:
        n = len(self.budgets)
        if weights is None:
            if n > len(OFFICIAL_BUDGET_WEIGHTS):
                raise ValueError(f'{n} budgets ({self.budgets}) but the official weights cover '
                                 f'{len(OFFICIAL_BUDGET_WEIGHTS)}: pass budget_weights')
            return OFFICIAL_BUDGET_WEIGHTS[:n]
        weights = tuple(float(w) for w in weights)
        if len(weights) != n or any(w < 0 for w in weights) or not any(weights):
            raise ValueError(f'budget_weights must give one non-negative weight per budget '
                             f'{self.budgets} (not all zero), got {weights}')
        return weights

    def _default_out_indices(
            self, out_indices: Optional[Union[int, Sequence[int]]]) -> Union[int, Sequence[int]]:
        if out_indices is not None:
            return out_indices
        depth = self.depth
        evenly = quarter_blocks(depth)
        if self.out_type in ('raw', 'global') or (self.out_type == 'pyramid' and len(evenly) < 4):
            return (depth - 1, )  # (a pyramid from the last block for trunks under 4 deep)
        return evenly

    def _init_official(self) -> None:
        """The official init: trunc normal (std .02) for every Linear and the patch projection,
        zero biases, unit LayerNorms; core tokens ``N(0, 1/D)`` and FPS coordinates are set at
        construction, ``alpha`` by :class:`CoreCoordUpdate`."""
        self.apply(init_linear_and_norm)
        nn.init.trunc_normal_(self.patch_embed.proj.weight, std=.02)
        nn.init.zeros_(self.patch_embed.proj.bias)

    @property
    def num_cores(self) -> int:
        """Active cores in eval mode (and in training without nested dropout)."""
        return self._num_cores

    @num_cores.setter
    def num_cores(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value not in self.budgets:
            raise ValueError(f'num_cores must be a multiple of {self.core_chunk} between '
                             f'{self.core_chunk} and the bank size {self.max_cores} (one of '
                             f'{self.budgets}), got {value!r}')
        self._num_cores = value

    def sample_num_cores(self) -> int:
        """Draw a budget with :attr:`budget_weights` (the same on every rank under DDP)."""
        weights = torch.tensor(self.budget_weights, dtype=torch.float32)
        idx = torch.multinomial(weights, 1)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # rank 0 decides, as the official training: every replica must skip the same chunks
            dev = self.core_tokens[0].device
            idx = idx.to(dev if dist.get_backend() != 'gloo' else 'cpu')
            dist.broadcast(idx, src=0)
        return self.budgets[int(idx)]

    def draw_for_next_forward(self) -> None:
        """Draw the next training forward's budget now, eagerly: a compiled forward cannot draw
        the random int that sets its shapes (each budget compiles its own graph)."""
        if self.training and self.nested_dropout:
            self._drawn_num_cores = self.sample_num_cores()

    def active_num_cores(self) -> int:
        """The number of cores the next forward uses."""
        if self.training and self.nested_dropout:
            if self._drawn_num_cores is not None:
                drawn, self._drawn_num_cores = self._drawn_num_cores, None
                return drawn
            if torch.compiler.is_compiling():
                # compiled without a draw made beforehand: still a correct draw, at the cost of
                # a graph break here
                return _sample_outside_graph(self)
            return self.sample_num_cores()
        return self.num_cores

    def frozen_modules(self) -> List[nn.Module]:
        """Patch embedding and core bank; blocks ``0 .. frozen_stages-1`` and their norms."""
        frozen: List[nn.Module] = [self.patch_embed, self.core_tokens, self.core_coords,
                                   *self.blocks[:max(self.frozen_stages, 0)],
                                   *self._frozen_out_norms()]
        if self.frozen_stages == self.depth:
            # a wholly frozen trunk (linear probing) sees the eval-time patch positions
            frozen.append(self.rope)
        return frozen

    def forward_tokens(self, x: torch.Tensor, num_cores: Optional[int] = None
                       ) -> Tuple[List[torch.Tensor], HWShape, int]:
        """Run the trunk; returns ``(outs, (Hp, Wp), C)``, one normed ``[B, C + Hp*Wp, D]``
        sequence (cores first) per ``out_indices`` block (``num_cores`` None: the active budget)."""
        self.check_input(x)
        C = self.active_num_cores() if num_cores is None else num_cores
        if C not in self.budgets:
            raise ValueError(f'num_cores must be one of {self.budgets}, got {C!r}')
        B = x.shape[0]
        patches, hw = self.patch_embed(x)  # [B, N, D]
        n = C // self.core_chunk
        cores = torch.cat(list(self.core_tokens[:n]), dim=1).expand(B, -1, -1)  # [B, C, D]
        raw = torch.cat(list(self.core_coords[:n]), dim=1).expand(B, -1, -1)  # [B, C, 2]
        patch_xy = self.rope.augment(patch_centres(hw, x.device).expand(B, -1, -1))  # [B, N, 2]
        x = torch.cat((cores.to(patches.dtype), patches), dim=1)  # [B, C + N, D]
        outs = []
        for i, blk in enumerate(self.blocks[:self.out_indices[-1] + 1]):
            if blk.coord_head is not None:
                raw = blk.coord_head(raw, x[:, :C])
            cos, sin = self.rope(torch.cat((torch.tanh(raw), patch_xy.to(raw.dtype)), dim=1))
            x = run_block(blk, x, cos, sin, C, with_cp=self.with_cp)
            if i in self.out_indices:
                outs.append(self.out_norm(i)(x))
        return outs, hw, C

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """``x [B, in_channels, H, W]`` (any ``H, W >= 1``) -> a tuple per ``out_type``."""
        outs, hw, C = self.forward_tokens(x)
        if self.out_type == 'raw':
            out = outs[-1]
            if self.output_proj is not None:
                out = self.output_proj(out)
            return out[:, 0], out[:, C:]
        if self.out_type == 'global':
            return tuple(o[:, 0] for o in outs)
        maps = [tokens_to_map(o[:, C:], hw) for o in outs]  # [B, D, Hp, Wp], channels-last
        if self.pyramid is not None:
            return self.pyramid(maps)
        return tuple(maps)

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer depth, number of layers)`` of a parameter for mmpretrain's layer-wise lr decay,
        counted as its ViT: patch embedding and bank 0, block ``i`` ``i + 1``, the rest last."""
        num_layers = self.depth + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        if name.startswith(('patch_embed.', 'core_tokens.', 'core_coords.')):
            return 0, num_layers
        if name.startswith('blocks.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    # the family's strict Pretrained loading (StrictPretrainedMixin)
    optional_keys = r'(norm\d+|pyramid)\.'  # an official checkpoint has only the final norm
    # documented exceptions: without out_proj_dims the distillation projection is not used, and
    # a smaller core bank takes the first chunks of a larger one (both logged at WARNING)
    ignorable_keys = r'(output_proj\.|core_(tokens|coords)\.\d+$)'
    prefix_probe = 'patch_embed.proj.weight'
    checkpoint_signature = r'(^|\.)core_tokens\.0$'

    def checkpoint_filter(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return checkpoint_filter_veca(state_dict)

    def describe(self) -> str:
        proj = None if self.output_proj is None else self.output_proj.out_features
        patch_norm = not isinstance(self.patch_embed.norm, nn.Identity)
        return (f'{self.__class__.__name__}(arch={self.arch_settings}, max_cores='
                f'{self.max_cores}, patch_norm={patch_norm}, out_proj_dims={proj})')

    def extra_repr(self) -> str:
        return (f'num_cores={self.num_cores}, max_cores={self.max_cores}, nested_dropout='
                f'{self.nested_dropout}, out_type={self.out_type!r}')


# official name inside a block -> ours
_OFFICIAL_BLOCK = {'norm_attn': 'norm1', 'norm_ffn': 'norm2', 'attn.q_proj': 'attn.q',
                   'attn.k_proj': 'attn.k', 'attn.v_proj': 'attn.v', 'attn.out_proj': 'attn.proj',
                   'fc1': 'ffn.fc1', 'fc2': 'ffn.fc2'}


def _strip(key: str) -> str:
    return strip_key_prefix(key, ('module.', 'student.'))


def is_official_state_dict(state_dict: Dict[str, torch.Tensor]) -> bool:
    """Whether a state dict uses the official ``veca/model.py`` key names."""
    return any(_strip(k).startswith(('query_token_chunks.', 'qcoord_chunks.', 'pos_alpha'))
               for k in state_dict)


def unwrap_official(ckpt: dict) -> Dict[str, torch.Tensor]:
    """The state dict inside an official training checkpoint (under ``student``) or any other."""
    if isinstance(ckpt, dict) and isinstance(ckpt.get('student'), dict):
        return ckpt['student']
    return unwrap_state_dict(ckpt)


def checkpoint_filter_veca_official(
        state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map an official VECA checkpoint (any wrapping, ``module.``/``student.`` prefixes) to
    ``backbone.*`` keys of :class:`VECA` (``out_type='raw'``); pure. Unknown keys raise
    ``ValueError``. The key table: docs/design/veca.md.
    """
    sd = {_strip(k): v for k, v in unwrap_official(state_dict).items()}
    block_ids = {int(m.group(1)) for m in (re.match(r'blocks\.(\d+)\.', k) for k in sd) if m}
    if not block_ids or not is_official_state_dict(sd):
        raise ValueError('Not an official VECA state dict: expected blocks.{i}.*, '
                         'query_token_chunks.* and pos_alpha keys')
    depth = max(block_ids) + 1
    pos_ids = {int(m.group(1)) for m in (re.match(r'pos_linears\.(\d+)\.', k) for k in sd) if m}
    if pos_ids != set(range(depth - 1)):
        raise ValueError(f'pos_linears.{{l}} must exist for l = 0 .. {depth - 2} ({depth} blocks), '
                         f'got {sorted(pos_ids)}: the checkpoint is truncated or mixed')
    out, unknown = {}, []
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(norm_attn|norm_ffn|attn\.\w+_proj|fc1|fc2)\.(\w+)$', k)
        if m:
            out[f'backbone.blocks.{m.group(1)}.{_OFFICIAL_BLOCK[m.group(2)]}.{m.group(3)}'] = v
            continue
        m = re.match(r'(query_token_chunks|qcoord_chunks)\.(\d+)$', k)
        if m:
            name = 'core_tokens' if m.group(1) == 'query_token_chunks' else 'core_coords'
            out[f'backbone.{name}.{m.group(2)}'] = v
            continue
        m = re.match(r'pos_linears\.(\d+)\.(weight|bias)$', k)
        if m:
            out[f'backbone.blocks.{int(m.group(1)) + 1}.coord_head.fc.{m.group(2)}'] = v
        elif k == 'pos_alpha':
            if v.numel() != depth - 1:
                raise ValueError(f'pos_alpha has {v.numel()} entries for {depth} blocks '
                                 f'(expected {depth - 1})')
            for i in range(depth - 1):
                out[f'backbone.blocks.{i + 1}.coord_head.alpha'] = v[i].clone()
        elif k.startswith(('patch_embed.proj.', 'patch_embed.norm.', 'output_proj.')):
            out['backbone.' + k] = v
        elif k.startswith('final_norm.'):
            out[f'backbone.norm{depth - 1}.' + k[len('final_norm.'):]] = v
        else:
            unknown.append(k)
    if unknown:
        raise ValueError(f'checkpoint_filter_veca_official: {len(unknown)} keys of no official '
                         f'VECA module: '
                         f'{clip_keys(unknown)}')
    return out




def checkpoint_filter_veca(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Keys of a checkpoint for the :class:`VECA` backbone.

    An official checkpoint (``veca/model.py`` names, possibly a whole training checkpoint with the
    weights under ``student``) goes through :func:`checkpoint_filter_veca_official`. Any other state
    dict is unwrapped and loses a DDP ``module.`` prefix. Pure: the input is not modified.
    """
    state_dict = unwrap_official(state_dict)
    if is_official_state_dict(state_dict):
        return {k[len('backbone.'):]: v
                for k, v in checkpoint_filter_veca_official(state_dict).items()}
    return strip_module_prefix(state_dict)
