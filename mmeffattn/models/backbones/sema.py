"""SEMA and MILA (MLLA) hierarchical backbones for OpenMMLab.

Papers: SEMA (Tran et al.), arXiv 2506.08297; MLLA (Han et al., NeurIPS 2024), arXiv 2405.16605.
MLLA's macro design (conv stem, four stages, MobileNet-style downsampling); ``attn_type='linear'``
is MILA's linear attention, ``'sema'`` SEMA's window softmax plus the mean of all values.
Official checkpoints load via :func:`checkpoint_filter_mlla`. Design: docs/design/sema.md.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmeffattn.ops import sema_attention_qk
from mmeffattn.registry import MODELS
from ..layers import ConvNormAct, DropPath, Mlp
from ..layers.heads import check_heads
from ..layers.rope import apply_rope_2d
from ..layers.tokens import map_to_tokens, pad_to_multiple, token_mean, tokens_to_map
from ..layers.window_linear import window_linear_attention
from ..utils import init_linear_and_norm, strip_module_prefix, unwrap_state_dict
from .attention_zoo import build_mixer, mixer_names, register_mixer
from .base import BaseBackbone, HWShape, drop_path_rates, run_block

__all__ = ['SEMA', 'MILA', 'checkpoint_filter_mlla', 'LinearAttention',
           'SEMAttention', 'SEMABlock', 'LOCAL_ATTNS']

#: the choices of SEMA's localized attention ``A_Phi`` (``local_attn=``)
LOCAL_ATTNS = ('softmax', 'linear')


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return value


class LinearAttention(nn.Module):
    """MLLA/MILA linear attention (``phi = ELU + 1``) with 2-D RoPE and LePE; ``v = x``.

    The normalizer uses the unrotated q and k, as the official code.

    Args:
        dim, num_heads: channels and heads.
        qkv_bias: bias of the ``qk`` projection.
        rope_base: RoPE frequency base.
        with_mean: add ``mean_j v_j`` (SEMA's averaging on MILA; off in MILA).
        value_proj: values from a ``Linear(dim, dim)`` ``v`` (off in MILA: ``v = x``).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 rope_base: float = 10000., *, with_mean: bool = False,
                 value_proj: bool = False) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.rope_base = rope_base
        self.with_mean = _check_bool('with_mean', with_mean)
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        # None without a value projection: no ``v`` keys in the state dict
        self.v = nn.Linear(dim, dim, bias=qkv_bias) \
            if _check_bool('value_proj', value_proj) else None
        self.elu = nn.ELU()
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        nh, hd = self.num_heads, C // self.num_heads
        q, k = self.qk(x).unflatten(-1, (2, C)).unbind(-2)  # [B, N, C] each
        # q and k apart: ELU writes each contiguously, so RoPE needs no copy
        q, k = self.elu(q).add_(1.0), self.elu(k).add_(1.0)
        q_rope, k_rope = apply_rope_2d((q, k), hw, self.rope_base)  # one table for both
        v = self.v(x) if self.v is not None else x  # the values (MILA: the input itself)
        # tokens-major throughout: [C, nh] marks each channel's head, so that per-head products
        # are products of the unsplit [B, N, C] tensors (no head split copies)
        head_of = torch.eye(nh, dtype=q.dtype, device=q.device).repeat_interleave(hd, 0)
        k_mean = token_mean(k, 1).unsqueeze(-1) * head_of  # [B, C, nh], block diagonal
        z = 1 / (torch.bmm(q, k_mean) + 1e-6)  # [B, N, nh]: 1 / (q_h . mean_j k_h,j)
        if q.is_cpu and q.dtype in (torch.float16, torch.bfloat16):
            # oneDNN's 16-bit batched matmul copies strided head views, so full-width products
            # kept to the diagonal blocks are cheaper (alpha: no 16-bit overflow of the sum)
            kv = torch.baddbmm(q.new_zeros(()), k_rope.transpose(1, 2), v, beta=0,
                               alpha=1 / N) * (head_of @ head_of.t())  # [B, C, C]
            out = torch.bmm(q_rope, kv).unflatten(-1, (nh, hd))  # [B, N, nh, hd]
        else:
            def heads(t: torch.Tensor) -> torch.Tensor:
                return t.unflatten(-1, (nh, hd)).transpose(1, 2)  # [B, nh, N, hd] views

            kv = (heads(k_rope).transpose(-2, -1) @ heads(v)).mul_(1 / N)  # [B, nh, hd, hd]
            out = (heads(q_rope) @ kv).transpose(1, 2)  # [B, N, nh, hd]
        out.mul_(z.unsqueeze(-1))
        if self.with_mean:
            out.add_(token_mean(v, 1).unflatten(-1, (nh, hd)).unsqueeze(1))
        # added into LePE's fresh output (its backward does not need it), read through strides
        y = map_to_tokens(self.lepe(tokens_to_map(v, hw)))  # [B, N, C]
        y.unflatten(-1, (nh, hd)).add_(out)
        return y

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, num_heads={self.num_heads}, with_mean={self.with_mean}, '
                f'value_proj={self.v is not None}')


class SEMAttention(nn.Module):
    """SEMA's token mixer: ``A_Phi(q, k) v + mean_j v_j + LePE(v)``, window attention plus the mean.

    Args:
        dim, num_heads: channels and heads (head dim ``dim // num_heads``).
        window_size: side of the non-overlapping windows.
        qkv_bias: bias of the ``qk`` and ``v`` projections.
        backend: backend of :func:`mmeffattn.ops.sema_attention_qk` (None: automatic).
        with_mean: add ``mean_j v_j`` (False: Swin-style window softmax, the zoo's ``'window'``).
        value_proj: project the values with ``v`` (False: ``v = x`` as MLLA).
        local_attn: ``A_Phi``: ``'softmax'`` or ``'linear'`` (:func:`window_linear_attention`).
    """

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, qkv_bias: bool = True,
                 backend: Optional[str] = None, *, with_mean: bool = True,
                 value_proj: bool = True, local_attn: str = 'softmax') -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if local_attn not in LOCAL_ATTNS:
            raise ValueError(f'local_attn must be one of {LOCAL_ATTNS}, got {local_attn!r}')
        self.dim = dim
        self.num_heads = num_heads
        self.window_size = window_size
        self.backend = backend
        self.with_mean = _check_bool('with_mean', with_mean)
        self.local_attn = local_attn
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        # None without a value projection: no ``v`` keys in the state dict
        self.v = nn.Linear(dim, dim, bias=qkv_bias) \
            if _check_bool('value_proj', value_proj) else None
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        B, N, C = x.shape
        nh, hd = self.num_heads, C // self.num_heads
        qk = self.qk(x).reshape(B, N, 2, nh, hd)  # a view (the ops accept any strides)
        v = self.v(x) if self.v is not None else x  # [B, N, C]
        vh = v.reshape(B, N, nh, hd).transpose(1, 2)  # [B, nh, N, hd]
        if self.local_attn == 'linear':
            q, k = (t.transpose(1, 2) for t in qk.unbind(2))  # [B, nh, N, hd] each
            out = window_linear_attention(q, k, vh, hw, self.window_size,
                                          with_mean=self.with_mean).transpose(1, 2)
        elif self.with_mean:  # localization A_Phi V, then averaging: + mean_j v_j
            out, mean = sema_attention_qk(qk, vh, hw, self.window_size, with_mean=True,
                                          return_mean=True, out_layout='bnhd',
                                          backend=self.backend)  # [B, N, nh, hd], [B, nh, hd]
        else:
            out = sema_attention_qk(qk, vh, hw, self.window_size, with_mean=False,
                                    out_layout='bnhd', backend=self.backend)
        # the terms are added into LePE's fresh output (its backward does not need it)
        y = map_to_tokens(self.lepe(tokens_to_map(v, hw)))  # [B, N, C]
        y.unflatten(-1, (nh, hd)).add_(out)  # out: [B, N, nh, hd]
        if self.local_attn == 'softmax' and self.with_mean:
            y.unflatten(-1, (nh, hd)).add_(mean.unsqueeze(1))
        return y

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, '
                f'with_mean={self.with_mean}, value_proj={self.v is not None}, '
                f'local_attn={self.local_attn!r}')


# The family's own token mixers in the attention zoo's registry (the others are registered in
# attention_zoo.py); each builder takes the block's common arguments and its own options.
@register_mixer('sema')
def _build_sema(dim: int, num_heads: int, *, window_size: int, qkv_bias: bool,
                backend: Optional[str], with_mean: bool = True, value_proj: bool = True,
                local_attn: str = 'softmax') -> nn.Module:
    """SEMA: windowed softmax + mean of the values (:class:`SEMAttention`)."""
    return SEMAttention(dim, num_heads, window_size, qkv_bias, backend=backend,
                        with_mean=with_mean, value_proj=value_proj, local_attn=local_attn)


@register_mixer('linear')
def _build_linear(dim: int, num_heads: int, *, qkv_bias: bool, rope_base: float,
                  with_mean: bool = False, value_proj: bool = False) -> nn.Module:
    """MILA/MLLA: ELU+1 linear attention with 2-D RoPE (:class:`LinearAttention`)."""
    return LinearAttention(dim, num_heads, qkv_bias, rope_base=rope_base, with_mean=with_mean,
                           value_proj=value_proj)


@register_mixer('window')
def _build_window(dim: int, num_heads: int, *, window_size: int, qkv_bias: bool,
                  backend: Optional[str], with_mean: bool = False, value_proj: bool = True,
                  local_attn: str = 'softmax') -> nn.Module:
    """Swin-style window softmax without SEMA's mean (:class:`SEMAttention`,
    ``with_mean=False``; no shifted windows: the block's convolutions connect the windows)."""
    return SEMAttention(dim, num_heads, window_size, qkv_bias, backend=backend,
                        with_mean=with_mean, value_proj=value_proj, local_attn=local_attn)


class SEMABlock(nn.Module):
    """MLLA's Mamba-like block with a choice of token mixer.

    ``x += cpe1(x)``; ``x += drop_path(out_proj(attn(SiLU(dwc(in_proj(LN(x))))) *
    SiLU(act_proj(LN(x)))))``; ``x += cpe2(x)``; ``x += drop_path(mlp(LN(x)))``.

    Args:
        dim, num_heads: channels and heads.
        attn_type: the mixer, a name of the attention zoo; ``mixer_cfg`` its options.
        window_size, qkv_bias, rope_base, attn_backend, stage: passed to the mixer's builder.
        mlp_ratio, drop, drop_path: MLP width ratio, MLP dropout, stochastic depth.
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str = 'sema', window_size: int = 7,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0.,
                 drop_path: float = 0., rope_base: float = 10000.,
                 attn_backend: Optional[str] = None, stage: int = 0,
                 mixer_cfg: Optional[dict] = None) -> None:
        super().__init__()
        self.dim = dim
        self.cpe1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, dim)
        self.act_proj = nn.Linear(dim, dim)
        self.dwc = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = nn.SiLU(inplace=True)  # on the fresh projection / conv outputs
        self.attn = build_mixer(attn_type, dim, num_heads, stage=stage, window_size=window_size,
                                qkv_bias=qkv_bias, rope_base=rope_base, backend=attn_backend,
                                **(mixer_cfg or {}))
        self.out_proj = nn.Linear(dim, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.cpe2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_cfg=dict(type='GELU'), drop=drop)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        # x: [B, N, C], N = H * W. Residuals are added into the branches' fresh outputs (a
        # conv's, a Linear's or DropPath's, whose backward does not need them): no new maps
        x = map_to_tokens(self.cpe1(tokens_to_map(x, hw))).add_(x)
        shortcut = x
        x = self.norm1(x)
        gate = self.act(self.act_proj(x))  # [B, N, C]
        x = self.in_proj(x)
        x = map_to_tokens(self.act(self.dwc(tokens_to_map(x, hw))))  # [B, N, C]
        x = self.attn(x, hw)
        x = self.drop_path(self.out_proj(x * gate)).add_(shortcut)
        x = map_to_tokens(self.cpe2(tokens_to_map(x, hw))).add_(x)
        return self.drop_path(self.mlp(self.norm2(x))).add_(x)


class Stem(nn.Module):
    """MLLA's stem (stride 4): 3x3 s2 -> C/2, two residual 3x3, 3x3 s2 -> 4C, 1x1 -> C; the image
    is zero padded right/bottom to a multiple of 4 first (as the official code)."""

    patch_size = 4

    def __init__(self, in_channels: int = 3, embed_dims: int = 96,
                 norm_cfg: dict = dict(type='BN'), act_cfg: dict = dict(type='ReLU')) -> None:
        super().__init__()
        half = embed_dims // 2
        kw = dict(bias=False, norm_cfg=norm_cfg)
        self.conv1 = ConvNormAct(in_channels, half, 3, stride=2, padding=1, act_cfg=act_cfg, **kw)
        self.conv2 = nn.Sequential(
            ConvNormAct(half, half, 3, padding=1, act_cfg=act_cfg, **kw),
            ConvNormAct(half, half, 3, padding=1, act_cfg=None, **kw))
        self.conv3 = nn.Sequential(
            ConvNormAct(half, embed_dims * 4, 3, stride=2, padding=1, act_cfg=act_cfg, **kw),
            ConvNormAct(embed_dims * 4, embed_dims, 1, act_cfg=None, **kw))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, HWShape]:
        # channels-last, oneDNN's native layout: no reorder around the convolutions, and the
        # tokens of every later stage are views of the maps (an NCHW map would make them strided)
        x = pad_to_multiple(x, self.patch_size).contiguous(memory_format=torch.channels_last)
        x = self.conv1(x)  # [B, C/2, H/2, W/2]
        x = self.conv2(x).add_(x)  # (into the BN's fresh output)
        x = self.conv3(x)  # [B, C, H/4, W/4]
        return map_to_tokens(x), (x.shape[2], x.shape[3])


class PatchMerging(nn.Module):
    """MobileNet-style downsampling: 1x1 (``ratio * 2C``) -> 3x3 depthwise s2 -> 1x1 (2C, norm);
    odd sides are zero padded, so the output grid is ``ceil(H / 2) x ceil(W / 2)``."""

    def __init__(self, dim: int, ratio: float = 4.0, norm_cfg: dict = dict(type='BN'),
                 act_cfg: dict = dict(type='ReLU')) -> None:
        super().__init__()
        out_channels = 2 * dim
        hidden = int(out_channels * ratio)
        self.conv = nn.Sequential(
            ConvNormAct(dim, hidden, 1, norm_cfg=None, act_cfg=act_cfg),
            ConvNormAct(hidden, hidden, 3, stride=2, padding=1, groups=hidden, norm_cfg=None,
                        act_cfg=act_cfg),
            ConvNormAct(hidden, out_channels, 1, norm_cfg=norm_cfg, act_cfg=None))

    def forward(self, x: torch.Tensor, hw: HWShape) -> Tuple[torch.Tensor, HWShape]:
        x = tokens_to_map(x, hw)  # [B, C, H, W]
        x = pad_to_multiple(x, 2)
        x = self.conv(x)  # [B, 2C, ceil(H/2), ceil(W/2)]
        return map_to_tokens(x), (x.shape[2], x.shape[3])


class SEMAStage(nn.Module):
    """``depth`` :class:`SEMABlock` s, then an optional :class:`PatchMerging` (MLLA's
    ``BasicLayer``); ``drop_path`` is one rate per block or one for all."""

    def __init__(self, dim: int, depth: int, num_heads: int,
                 drop_path: Union[float, Sequence[float]] = 0., downsample: bool = False,
                 with_cp: bool = False, norm_cfg: dict = dict(type='BN'),
                 act_cfg: dict = dict(type='ReLU'), **block_kwargs) -> None:
        super().__init__()
        dpr = list(drop_path) if isinstance(drop_path, (list, tuple)) else [drop_path] * depth
        self.with_cp = with_cp
        self.blocks = nn.ModuleList([
            SEMABlock(dim, num_heads, drop_path=dpr[i], **block_kwargs) for i in range(depth)])
        self.downsample = PatchMerging(dim, norm_cfg=norm_cfg, act_cfg=act_cfg) \
            if downsample else None

    def forward(self, x: torch.Tensor,
                hw: HWShape) -> Tuple[torch.Tensor, HWShape, torch.Tensor, HWShape]:
        """Returns ``(x_next, hw_next, x_out, hw_out)``: the downsampled tokens for the next stage
        and this stage's output tokens before downsampling."""
        for blk in self.blocks:
            x = run_block(blk, x, hw, with_cp=self.with_cp)
        if self.downsample is None:
            return x, hw, x, hw
        x_down, hw_down = self.downsample(x, hw)
        return x_down, hw_down, x, hw


@MODELS.register_module()
class SEMA(BaseBackbone):
    """SEMA / MILA hierarchical backbone (MLLA macro-architecture) for detection and segmentation.

    A stride-4 stem and four stages of :class:`SEMABlock` (``embed_dims * 2**i`` channels at
    stride ``4 * 2**i``); each ``out_indices`` map gets its own LayerNorm ``norm{i}``.

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'`` (or initials) or a dict of ``embed_dims``,
            ``depths``, ``num_heads``.
        attn_type: ``'sema'``, ``'linear'`` (MILA) or another zoo mixer; ``mixer_cfg`` options.
        in_channels: image channels.
        window_size: SEMA window side (>= 1).
        mlp_ratio, qkv_bias, drop_rate, drop_path_rate: MLP width, bias, dropout, drop path.
        out_indices, frozen_stages, norm_eval, with_cp, init_cfg: the OpenMMLab switches.
        norm_cfg, act_cfg: norm and activation of the stem and downsampling convolutions.
        rope_base: RoPE base of ``'linear'``.
        attn_backend: backend of the mixers' ops (None: automatic).
        with_mean, value_proj, local_attn: SEMA's ablations (None: the mixer's default).
    """

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], {
            'embed_dims': 64, 'depths': [2, 4, 8, 4], 'num_heads': [2, 4, 8, 16]}),
        **dict.fromkeys(['s', 'small'], {
            'embed_dims': 64, 'depths': [3, 6, 21, 6], 'num_heads': [2, 4, 8, 16]}),
        **dict.fromkeys(['b', 'base'], {
            'embed_dims': 96, 'depths': [3, 6, 21, 6], 'num_heads': [3, 6, 12, 24]}),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    mini_arch = dict(embed_dims=32, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8])

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 attn_type: str = 'sema',
                 in_channels: int = 3,
                 window_size: int = 7,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 norm_cfg: dict = dict(type='BN'),
                 act_cfg: dict = dict(type='ReLU'),
                 rope_base: float = 10000.,
                 attn_backend: Optional[str] = None,
                 with_mean: Optional[bool] = None,
                 value_proj: Optional[bool] = None,
                 local_attn: Optional[str] = None,
                 mixer_cfg: Optional[dict] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(arch, in_channels, init_cfg)
        if attn_type not in mixer_names():
            raise ValueError(f'attn_type must be one of {mixer_names()}, got {attn_type!r}')
        if mixer_cfg is not None and not isinstance(mixer_cfg, dict):
            raise ValueError(f'mixer_cfg must be a dict of mixer options, got {mixer_cfg!r}')
        switches = dict(with_mean=with_mean, value_proj=value_proj, local_attn=local_attn)
        mixer_cfg = {**(mixer_cfg or {}), **{k: v for k, v in switches.items() if v is not None}}
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f'window_size must be an integer >= 1, got {window_size!r}')
        self.attn_type = attn_type
        self.window_size = window_size
        self.mixer_cfg = mixer_cfg
        embed_dims = self.arch_settings['embed_dims']
        depths = self.arch_settings['depths']
        num_heads = self.arch_settings['num_heads']
        self.embed_dims = embed_dims
        self.num_layers = len(depths)
        self.num_features = [int(embed_dims * 2**i) for i in range(self.num_layers)]
        self._init_training_switches(out_indices, self.num_layers, 'stages', frozen_stages,
                                     norm_eval, with_cp)

        self.patch_embed = Stem(in_channels, embed_dims, norm_cfg=norm_cfg, act_cfg=act_cfg)
        self.pos_drop = nn.Dropout(p=drop_rate)

        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.num_layers):
            start = sum(depths[:i])
            self.layers.append(SEMAStage(
                dim=self.num_features[i], depth=depths[i], num_heads=num_heads[i],
                drop_path=dpr[start:start + depths[i]], downsample=i < self.num_layers - 1,
                with_cp=with_cp, norm_cfg=norm_cfg, act_cfg=act_cfg, attn_type=attn_type,
                window_size=window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate,
                rope_base=rope_base, attn_backend=attn_backend, stage=i, mixer_cfg=mixer_cfg))
        self._add_out_norms(self.num_features)

        self.apply(init_linear_and_norm)
        self._freeze_stages()

    @classmethod
    def _check_arch(cls, arch: dict) -> dict:
        if isinstance(arch['embed_dims'], bool) or not isinstance(arch['embed_dims'], int):
            raise ValueError(f"arch 'embed_dims' is the first stage's width, an int (each stage "
                             f"doubles it), got {arch['embed_dims']!r}")
        if len(arch['depths']) != len(arch['num_heads']):
            raise ValueError(f"arch 'depths' {arch['depths']} and 'num_heads' "
                             f"{arch['num_heads']} differ in length")
        return arch

    def frozen_modules(self) -> List[nn.Module]:
        """The stem and the first ``frozen_stages`` stages with their downsampling and norms."""
        return [self.patch_embed, self.pos_drop, *self.layers[:max(self.frozen_stages, 0)],
                *self._frozen_out_norms()]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Args: x: ``[B, in_channels, H, W]``, any ``H, W >= 1``.

        Returns:
            One ``[B, embed_dims * 2**i, ~H / 2**(i+2), ~W / 2**(i+2)]`` map per ``i`` in
            ``out_indices`` (sizes rounded up at each stride-2 step).
        """
        self.check_input(x)
        x, hw = self.patch_embed(x)  # [B, N, C0]
        x = self.pos_drop(x)
        outs = []
        for i, layer in enumerate(self.layers):
            x, hw, out, out_hw = layer(x, hw)
            if i in self.out_indices:
                out = self.out_norm(i)(out)  # [B, N_i, C_i]
                outs.append(tokens_to_map(out, out_hw).contiguous())  # [B, C_i, H_i, W_i]
        return tuple(outs)

    # strict Pretrained loading comes from StrictPretrainedMixin; these tailor it to the family
    optional_keys = r'norm\d+\.'  # output norms: an ImageNet checkpoint has none
    prefix_probe = 'patch_embed.conv1.conv.weight'
    checkpoint_signature = r'(^|\.)layers\.\d+\.blocks\.\d+\.attn\.qk\.weight$'

    def checkpoint_filter(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return checkpoint_filter_mlla(state_dict)

    def describe(self) -> str:
        cfg = f', mixer_cfg={self.mixer_cfg}' if self.mixer_cfg else ''
        return (f'{self.__class__.__name__}(arch={self.arch_settings}, '
                f'attn_type={self.attn_type!r}{cfg})')

    @classmethod
    def checkpoint_family(cls, keys: List[str]) -> str:
        """Which of SEMA and MILA a checkpoint of this signature is: SEMA's has the value
        projection ``attn.v``."""
        return 'SEMA' if any('.attn.v.' in k for k in keys) else 'MILA'

    def mismatch_cause(self, missing: List[str], unexpected: List[str],
                       mismatched: List[str]) -> Optional[str]:
        # SEMA and MILA of one arch differ by SEMA's value projection attn.v alone: only a
        # mismatch of exactly those keys is that (another family's or arch's differs elsewhere)
        def only_v(keys: List[str]) -> bool:
            return bool(keys) and all('.attn.v.' in k for k in keys)

        if only_v(unexpected) and not missing and not mismatched:
            if self.attn_type == 'linear':
                return ("This looks like a SEMA checkpoint: MILA (attn_type='linear') has no "
                        "value projection (attn.v); build mmeffattn.SEMA for it, or pick a "
                        'MILA/MLLA checkpoint.')
            return ('The checkpoint has a value projection (attn.v) that this model, built with '
                    'value_proj=False, lacks: build it with value_proj=True (the default), or '
                    'pick a checkpoint trained without it.')
        if self.attn_type == 'sema' and only_v(missing) and not unexpected and not mismatched:
            return ("This looks like a MILA/MLLA checkpoint: it has no value projection "
                    "(attn.v) that SEMA needs; build mmeffattn.MILA for it, or pick a SEMA "
                    'checkpoint.')
        return super().mismatch_cause(missing, unexpected, mismatched)


@MODELS.register_module()
class MILA(SEMA):
    """MILA (MLLA) backbone: :class:`SEMA` with ``attn_type='linear'`` by default."""

    def __init__(self, *args, attn_type: str = 'linear', **kwargs) -> None:
        super().__init__(*args, attn_type=attn_type, **kwargs)


def checkpoint_filter_mlla(state_dict: Dict[str, torch.Tensor],
                           final_norm: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Map an official MLLA/MILA checkpoint to :class:`SEMA`/:class:`MILA` keys (pure).

    The names are the official ones, so this unwraps (``model``/``state_dict``, DDP's ``module.``)
    and drops the classifier ``head.*``, the classification norm ``norm.*`` and the fixed-size RoPE
    tables. ``final_norm='norm3'`` renames ``norm.*`` to it instead (the official classifier's norm
    before pooling, for ``out_indices=(3, )`` under a pooling head).
    """
    out = {}
    for k, v in strip_module_prefix(unwrap_state_dict(state_dict)).items():
        if k.startswith('norm.') and final_norm:
            k = final_norm + k[len('norm'):]
        elif k.startswith(('head.', 'norm.')) or k.endswith('attn.rope.rotations'):
            continue
        out[k] = v
    return out
