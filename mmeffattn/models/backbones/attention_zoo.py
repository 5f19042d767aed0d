"""The attention zoo: every token mixer of the package in one macro-architecture, the SEMA pyramid.

``SEMA(attn_type=...)`` changes only the block's ``attn`` slot, ``mixer(x [B, N, C], hw) -> [B, N,
C]``, so that the families' mixers compare on an equal footing. Mixers are registered where they are
defined (:func:`register_mixer`) and built by :func:`build_mixer`; an option a mixer does not take
raises. The table of mixers: docs/design/attention_zoo.md.
"""
import inspect
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import core_periphery_attention
from ..layers.heads import check_heads
from ..layers.tokens import map_to_tokens, tokens_to_map
from .base import HWShape
from .laplacianformer import LaplacianAttention
from .weightformer import DynamicDWConv, DynamicLinear

__all__ = ['register_mixer', 'build_mixer', 'mixer_names', 'mixer_options', 'COMMON_ARGS',
           'GlobalSoftmaxAttention', 'CorePeripheryMixer', 'DynamicMixer']

MixerBuilder = Callable[..., nn.Module]
_MIXERS: Dict[str, MixerBuilder] = {}
#: arguments every block passes; a builder receives those its signature names
COMMON_ARGS = ('stage', 'window_size', 'qkv_bias', 'rope_base', 'backend')


def register_mixer(name: str) -> Callable[[MixerBuilder], MixerBuilder]:
    """Register ``builder(dim, num_heads, *, <common args>, <options>) -> nn.Module`` as
    ``attn_type=name``."""

    def wrap(builder: MixerBuilder) -> MixerBuilder:
        if name in _MIXERS:
            raise KeyError(f'attn_type {name!r} is already registered')
        _MIXERS[name] = builder
        return builder

    return wrap


def mixer_names() -> Tuple[str, ...]:
    """The registered ``attn_type`` names, in registration order (sema.py registers its own
    mixers when the package is imported)."""
    return tuple(_MIXERS)


def _keyword_args(builder: MixerBuilder) -> Tuple[str, ...]:
    return tuple(n for n, p in inspect.signature(builder).parameters.items()
                 if p.kind == inspect.Parameter.KEYWORD_ONLY)


def mixer_options(attn_type: str) -> Tuple[str, ...]:
    """The options (besides :data:`COMMON_ARGS`) the mixer ``attn_type`` takes."""
    names = mixer_names()
    if attn_type not in names:
        raise ValueError(f'attn_type must be one of {names}, got {attn_type!r}')
    return tuple(n for n in _keyword_args(_MIXERS[attn_type]) if n not in COMMON_ARGS)


def build_mixer(attn_type: str, dim: int, num_heads: int, *, stage: int = 0,
                window_size: int = 7, qkv_bias: bool = True, rope_base: float = 10000.,
                backend: Optional[str] = None, **options) -> nn.Module:
    """The token mixer ``attn_type`` for a block of ``dim`` channels in stage ``stage``.

    Raises:
        ValueError: an unknown ``attn_type``, or an option the mixer does not take (the message
            lists its options).
    """
    own = mixer_options(attn_type)
    unknown = sorted(set(options) - set(own))
    if unknown:
        raise ValueError(f'attn_type={attn_type!r} does not take {unknown}; its options are '
                         f'{list(own)} (set them in mixer_cfg, or drop them for this mixer)')
    builder = _MIXERS[attn_type]
    accepted = _keyword_args(builder)
    common = dict(stage=stage, window_size=window_size, qkv_bias=qkv_bias, rope_base=rope_base,
                  backend=backend)
    return builder(dim, num_heads, **{k: v for k, v in common.items() if k in accepted},
                   **options)


def _per_stage(name: str, value: Union[int, Sequence[int]], stage: int):
    """``value`` itself, or its entry for ``stage`` when it is a per-stage sequence."""
    if isinstance(value, (list, tuple)):
        if stage >= len(value):
            raise ValueError(f'{name} gives {len(value)} per-stage values, but stage {stage} '
                             f'needs one: give one per stage or a single value')
        return value[stage]
    return value


class GlobalSoftmaxAttention(nn.Module):
    """Global multi-head softmax attention (ViT's) in SEMA's layout: ``qk`` and ``v`` projections,
    SDPA, LePE on v. Quadratic in ``N``.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        nh, hd = self.num_heads, C // self.num_heads
        q, k = self.qk(x).reshape(B, N, 2, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
        v = self.v(x)  # [B, N, C]
        out = F.scaled_dot_product_attention(q, k, v.reshape(B, N, nh, hd).transpose(1, 2))
        out = out.transpose(1, 2).reshape(B, N, C)  # [B, N, C]
        return out + map_to_tokens(self.lepe(tokens_to_map(v, hw)))

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}'


class CorePeripheryMixer(nn.Module):
    """VECA-style core-periphery attention as a per-block mixer, with its own ``C`` learned cores.

    Cores gather from ``[cores; patches]`` (:func:`mmeffattn.ops.core_periphery_attention`), then
    patches read the updated cores: ``O((C + N) C D)``. No RoPE (the block's convolutions and
    LePE give position).

    Args:
        dim, num_heads: channels and heads.
        num_cores: learned cores ``C`` (>= 1).
        qkv_bias: bias of the projections.
        backend: backend of the op (None: automatic).
    """

    def __init__(self, dim: int, num_heads: int, num_cores: int = 16, qkv_bias: bool = True,
                 backend: Optional[str] = None) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if isinstance(num_cores, bool) or not isinstance(num_cores, int) or num_cores < 1:
            raise ValueError(f'num_cores must be an integer >= 1, got {num_cores!r}')
        self.dim = dim
        self.num_heads = num_heads
        self.num_cores = num_cores
        self.backend = backend
        self.cores = nn.Parameter(torch.empty(1, num_cores, dim))
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        nn.init.trunc_normal_(self.cores, std=.02)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        B, L, C = t.shape
        return t.reshape(B, L, self.num_heads, C // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        nc = self.num_cores
        cores = self.cores.to(x.dtype).expand(B, -1, -1)  # [B, nc, C]
        seq = torch.cat([cores, x], dim=1)  # [B, nc + N, C]
        q, k = (self._heads(t) for t in self.qk(seq).chunk(2, dim=-1))  # [B, h, nc + N, hd]
        v_seq = self.v(seq)  # [B, nc + N, C]
        v = self._heads(v_seq)
        # hop 1: the cores gather from every token
        out = core_periphery_attention(q, k, v, nc, backend=self.backend)  # [B, h, nc + N, hd]
        gathered = cores + out[:, :, :nc].transpose(1, 2).reshape(B, nc, C)  # [B, nc, C]
        # hop 2: the patches read the updated cores (patch keys/values are not read by patches)
        k_c, _ = self.qk(gathered).chunk(2, dim=-1)
        k2 = torch.cat([self._heads(k_c), k[:, :, nc:]], dim=2)
        v2 = torch.cat([self._heads(self.v(gathered)), v[:, :, nc:]], dim=2)
        out = core_periphery_attention(q, k2, v2, nc, backend=self.backend)[:, :, nc:]
        out = out.transpose(1, 2).reshape(B, N, C)  # [B, N, C]
        return out + map_to_tokens(self.lepe(tokens_to_map(v_seq[:, nc:], hw)))

    def extra_repr(self) -> str:
        return f'dim={self.dim}, num_heads={self.num_heads}, num_cores={self.num_cores}'


class DynamicMixer(nn.Module):
    """WeightFormer's dynamic mixing: :class:`DynamicDWConv` then :class:`DynamicLinear`.

    Args:
        dim: channels (divisible by ``reduction``); ``num_heads`` is unused.
        kernel_size, reduction: the dynamic kernel's odd side and the linear layer's rank reduction.
        backend: backend of the ops (None: automatic).
    """

    def __init__(self, dim: int, kernel_size: int = 3, reduction: int = 4,
                 backend: Optional[str] = None) -> None:
        super().__init__()
        self.dim = dim
        self.dwc = DynamicDWConv(dim, kernel_size, backend=backend)
        self.fc = DynamicLinear(dim, dim, reduction=reduction, backend=backend)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        x = map_to_tokens(self.dwc(tokens_to_map(x, hw)))  # [B, N, C]
        return self.fc(x, hw)  # [B, N, C]


@register_mixer('softmax')
def _build_softmax(dim: int, num_heads: int, *, qkv_bias: bool) -> nn.Module:
    """Global softmax attention (quadratic)."""
    return GlobalSoftmaxAttention(dim, num_heads, qkv_bias)


@register_mixer('laplacian')
def _build_laplacian(dim: int, num_heads: int, *, stage: int, qkv_bias: bool,
                     backend: Optional[str],
                     sr_ratios: Union[int, Sequence[int]] = (8, 4, 2, 1),
                     max_landmarks: Optional[int] = 128) -> nn.Module:
    """LaplacianFormer's Nystrom attention with its own defaults and per-stage ``sr_ratios``
    (landmarks capped by ``max_landmarks``); the last stage keeps the Laplacian kernel too."""
    return LaplacianAttention(dim, num_heads, sr_ratio=_per_stage('sr_ratios', sr_ratios, stage),
                              max_landmarks=max_landmarks, qkv_bias=qkv_bias, backend=backend)


@register_mixer('core_periphery')
def _build_core_periphery(dim: int, num_heads: int, *, stage: int, qkv_bias: bool,
                          backend: Optional[str],
                          num_cores: Union[int, Sequence[int]] = 16) -> nn.Module:
    """Core-periphery attention with ``num_cores`` learned cores (one value, or one per stage)."""
    return CorePeripheryMixer(dim, num_heads, _per_stage('num_cores', num_cores, stage),
                              qkv_bias, backend=backend)


@register_mixer('dynamic')
def _build_dynamic(dim: int, num_heads: int, *, backend: Optional[str], kernel_size: int = 3,
                   reduction: int = 4) -> nn.Module:
    """WeightFormer's dynamic depthwise conv + dynamic linear."""
    return DynamicMixer(dim, kernel_size, reduction, backend=backend)
