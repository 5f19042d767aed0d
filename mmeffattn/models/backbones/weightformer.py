"""WeightFormer: an isotropic backbone that models global context through predicted weights.

Paper: Linear-Time Global Visual Modeling without Explicit Attention (He et al.), arXiv 2605.01711.
Every ``dynamic_every``-th block adds a weight predicted from all tokens to its static weights
(:class:`DynamicDWConv`, :class:`DynamicLinear`). Design: docs/design/weightformer.md.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.ops import dynamic_dwconv, dynamic_weight
from mmeffattn.registry import MODELS
from ..layers import DropPath, Mlp
from ..layers.pool import adaptive_avg_pool2d
from ..layers.tokens import map_to_tokens, pad_to_multiple, tokens_to_map
from ..layers.vit_pyramid import build_vit_pyramid
from ..utils import (clip_keys, init_linear_and_norm, strip_module_prefix,
                     unwrap_state_dict)
from .base import BaseBackbone, HWShape, drop_path_rates, quarter_blocks, run_block

__all__ = ['WeightFormer', 'DynamicLinear', 'DynamicDWConv',
           'checkpoint_filter_weightformer_official',
           'checkpoint_filter_weightformer', 'is_dynamic_block']

LN_EPS = 1e-6


def is_dynamic_block(i: int, every: int = 3) -> bool:
    """Whether block ``i`` (0-based) of the trunk is dynamic: ``(i + 2) % every == 0`` (the
    official rule for ``every = 3``: one block in three, starting at block 1)."""
    return (i + 2) % every == 0


class DynamicLinear(nn.Module):
    """A linear layer whose weight is static plus predicted from the tokens (``DynLinear``).

    ``y = x (W + dW) + b``, ``dW`` the paper's bilateral low-rank prediction from the 2x2-pooled
    tokens (:func:`mmeffattn.ops.dynamic_weight`; see docs/design/weightformer.md).

    Args:
        in_features, out_features: channels (divisible by ``reduction``).
        reduction: rank reduction of the two branches (4 officially).
        backend: backend of the op (None: automatic).
    """

    def __init__(self, in_features: int, out_features: Optional[int] = None,
                 reduction: int = 4, backend: Optional[str] = None) -> None:
        super().__init__()
        out_features = out_features or in_features
        if in_features % reduction or out_features % reduction:
            raise ValueError(f'DynamicLinear needs in_features ({in_features}) and out_features '
                             f'({out_features}) divisible by reduction ({reduction})')
        self.in_features = in_features
        self.out_features = out_features
        self.reduction = reduction
        self.backend = backend
        self.scale = in_features**-0.5
        self.rank_in = in_features // reduction
        self.rank_out = out_features // reduction
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.token_proj = nn.Linear(in_features, self.rank_in + self.rank_out)
        self.in_basis = nn.Parameter(torch.empty(self.rank_in, in_features))
        self.out_basis = nn.Parameter(torch.empty(self.rank_out, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # official init: trunc normal std .02 for the static and basis weights and the bias
        for p in (self.weight, self.bias, self.in_basis, self.out_basis):
            nn.init.trunc_normal_(p, std=.02)

    def factors(self, x: torch.Tensor, hw: HWShape) -> Tuple[torch.Tensor, torch.Tensor]:
        """The two sides ``U [B, M, C_in]`` and ``V [B, M, C_out]`` of ``dW`` for tokens ``x``."""
        H, W = hw
        pooled = F.avg_pool2d(tokens_to_map(x, hw), (min(2, H), min(2, W)))  # [B, C_in, h, w]
        ctx = self.token_proj(map_to_tokens(pooled))  # [B, M, r_in + r_out]
        a_in, a_out = ctx.split([self.rank_in, self.rank_out], dim=-1)
        u = F.silu(a_in) @ self.in_basis  # [B, M, C_in]
        v = F.silu(a_out) @ self.out_basis  # [B, M, C_out]
        return u, v

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        # x: [B, N, C_in]
        u, v = self.factors(x, hw)
        w = dynamic_weight(u, v, x.shape[1], self.scale, self.weight,
                           backend=self.backend)  # [B, C_out, C_in], dW + W
        y = x @ w.transpose(1, 2)  # [B, N, C_out]
        # the bias in the product's dtype (bf16 under autocast: no fp32 map into the bf16 MLP)
        return y.add_(self.bias.to(y.dtype))

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'reduction={self.reduction}')


class DynamicDWConv(nn.Module):
    """A depthwise convolution whose kernel is static plus predicted per sample (``DynCnn``).

    ``kernel_gen`` maps the input pooled to ``K x K`` to per-sample kernels, normalized and added to
    the static one; :func:`mmeffattn.ops.dynamic_dwconv` convolves.

    Args:
        dim: channels.
        kernel_size: odd kernel side (3 officially).
        backend: backend of the op (None: automatic).
    """

    def __init__(self, dim: int, kernel_size: int = 3, backend: Optional[str] = None) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f'DynamicDWConv needs an odd kernel_size, got {kernel_size}')
        self.dim = dim
        self.kernel_size = kernel_size
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(dim))
        self.kernel_gen = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=1), nn.GELU(),
            nn.Conv2d(dim, dim, kernel_size=1, bias=False))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.weight, std=.02)
        nn.init.trunc_normal_(self.bias, std=.02)

    def raw_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted kernels before normalization, ``[B, C, K, K]``, for the map ``x``."""
        return self.kernel_gen(adaptive_avg_pool2d(x, self.kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, H, W]; normalized predicted kernel + static kernel, then the convolution
        return dynamic_dwconv(x, self.raw_kernel(x), self.bias, self.weight, normalize=True,
                              backend=self.backend)  # [B, C, H, W]

    def extra_repr(self) -> str:
        return f'dim={self.dim}, kernel_size={self.kernel_size}'


class DynamicMlp(Mlp):
    """:class:`~mmeffattn.models.layers.Mlp` whose ``fc1`` is a :class:`DynamicLinear`."""

    def __init__(self, in_features: int, hidden_features: int,
                 act_cfg: dict = dict(type='GELU'), drop: float = 0.,
                 reduction: int = 4, backend: Optional[str] = None) -> None:
        super().__init__(in_features, hidden_features, act_cfg=act_cfg, drop=drop)
        self.fc1 = DynamicLinear(in_features, hidden_features, reduction=reduction,
                                 backend=backend)

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x, hw)))  # [B, N, hidden]
        return self.drop(self.fc2(x))  # [B, N, C]


class WeightFormerBlock(nn.Module):
    """One WeightFormer block: static (``x += DWConv(x)``) or dynamic (``x = LN(x)``, ``x +=
    DynamicDWConv(x)``, a :class:`DynamicLinear` first MLP layer), then the MLP residual."""

    def __init__(self, dim: int, mlp_ratio: float = 4., dynamic: bool = False, drop: float = 0.,
                 drop_path: float = 0., kernel_size: int = 3, reduction: int = 4,
                 backend: Optional[str] = None) -> None:
        super().__init__()
        self.dynamic = dynamic
        hidden = int(dim * mlp_ratio)
        if dynamic:
            self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
            self.dwc = DynamicDWConv(dim, kernel_size, backend=backend)
            self.mlp = DynamicMlp(dim, hidden, drop=drop, reduction=reduction, backend=backend)
        else:
            self.dwc = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
            self.mlp = Mlp(dim, hidden, act_cfg=dict(type='GELU'), drop=drop)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: torch.Tensor, hw: HWShape) -> torch.Tensor:
        # x: [B, N, C], N = H * W; the residuals are added into the branches' fresh outputs (a
        # convolution's, a Linear's or DropPath's, whose backward does not need them)
        if self.dynamic:
            x = self.norm1(x)  # normalizes the stream itself (official placement)
        x = map_to_tokens(self.dwc(tokens_to_map(x, hw))).add_(x)
        h = self.norm2(x)
        h = self.mlp(h, hw) if self.dynamic else self.mlp(h)
        return self.drop_path(h).add_(x)


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens, then a LayerNorm (the official ``patch_embed`` +
    ``init_norm``); the image zero padded on the bottom/right to a multiple of ``patch_size`` first.
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 192, patch_size: int = 16) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dims, eps=LN_EPS)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, HWShape]:
        # channels-last into the convolution: the tokens out are a view of its output
        x = pad_to_multiple(x, self.patch_size).contiguous(memory_format=torch.channels_last)
        x = self.proj(x)  # [B, C, ceil(H/p), ceil(W/p)]
        hw = (x.shape[2], x.shape[3])
        return self.norm(map_to_tokens(x)), hw


@MODELS.register_module()
class WeightFormer(BaseBackbone):
    """WeightFormer isotropic backbone for classification, detection and segmentation.

    Blocks run at stride ``patch_size``; each ``out_indices`` output gets its own LayerNorm and is
    returned per ``out_type`` (see docs/design/weightformer.md). Later blocks are not run.

    Args:
        arch: ``'tiny'``, ``'small'``, ``'base'`` (or initials) or a dict of ``embed_dims``,
            ``depth`` (``mlp_ratio``).
        in_channels, patch_size: image channels and patch side.
        out_indices: blocks whose outputs are returned (None: ``out_type``'s default).
        out_type: ``'featmap'``, ``'avgpool'`` (``(-1, )``: the official head input), ``'pyramid'``.
        drop_rate, drop_path_rate: MLP dropout and stochastic depth of the MLP branches.
        frozen_stages, norm_eval, with_cp, init_cfg: the OpenMMLab switches.
        dynamic_every: block ``i`` is dynamic when ``(i + 2) % dynamic_every == 0``.
        pyramid_cfg: :class:`~mmeffattn.models.layers.ViTPyramid` arguments for ``'pyramid'``.
        attn_backend: backend of the dynamic blocks' ops (None: automatic).
    """

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], {'embed_dims': 192, 'depth': 17, 'mlp_ratio': 4.}),
        **dict.fromkeys(['s', 'small'], {'embed_dims': 384, 'depth': 17, 'mlp_ratio': 4.}),
        **dict.fromkeys(['b', 'base'], {'embed_dims': 384, 'depth': 17, 'mlp_ratio': 4.}),
    }
    arch_keys = ('embed_dims', 'depth')
    arch_defaults = dict(mlp_ratio=4.)
    mini_arch = dict(embed_dims=32, depth=5)
    mini_kwargs = dict(out_type='pyramid', out_indices=(0, 1, 2, 4),
                       pyramid_cfg=dict(norm_cfg=dict(type='BN')))
    out_norm_eps = LN_EPS
    out_types = ('featmap', 'avgpool', 'pyramid')
    kernel_size = 3  # depthwise convolutions (static and dynamic)
    reduction = 4  # rank reduction of the dynamic linear layers

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 patch_size: int = 16,
                 out_indices: Optional[Union[int, Sequence[int]]] = None,
                 out_type: str = 'pyramid',
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 dynamic_every: int = 3,
                 pyramid_cfg: Optional[dict] = None,
                 attn_backend: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(arch, in_channels, init_cfg)
        if out_type not in self.out_types:
            raise ValueError(f'out_type must be one of {self.out_types}, got {out_type!r}')
        if isinstance(dynamic_every, bool) or not isinstance(dynamic_every, int) or \
                dynamic_every < 1:
            raise ValueError(f'dynamic_every must be an integer >= 1 (one dynamic block in '
                             f'dynamic_every; the paper: 3), got {dynamic_every!r}')
        self.dynamic_every = dynamic_every
        self.embed_dims = embed_dims = self.arch_settings['embed_dims']
        self.depth = depth = self.arch_settings['depth']
        mlp_ratio = self.arch_settings['mlp_ratio']
        if embed_dims % self.reduction or int(embed_dims * mlp_ratio) % self.reduction:
            raise ValueError(f'embed_dims ({embed_dims}) and the MLP width must be divisible by '
                             f'{self.reduction} (the dynamic linear layers reduce by it)')
        self.patch_size = patch_size
        self.out_type = out_type
        self._init_training_switches(self._default_out_indices(out_indices), depth, 'blocks',
                                     frozen_stages, norm_eval, with_cp)
        self.dynamic_blocks = tuple(i for i in range(depth)
                                    if is_dynamic_block(i, dynamic_every))

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size)
        dpr = drop_path_rates(drop_path_rate, depth)
        self.blocks = nn.ModuleList([
            WeightFormerBlock(embed_dims, mlp_ratio, dynamic=i in self.dynamic_blocks,
                              drop=drop_rate,
                              drop_path=dpr[i], kernel_size=self.kernel_size,
                              reduction=self.reduction, backend=attn_backend)
            for i in range(depth)])
        self._add_out_norms(embed_dims)
        self.pyramid = build_vit_pyramid(out_type, embed_dims, self.out_indices, pyramid_cfg)

        self.apply(init_linear_and_norm)  # official init (the dynamic layers set their own)
        self._freeze_stages()

    def _default_out_indices(
            self, out_indices: Optional[Union[int, Sequence[int]]]) -> Union[int, Sequence[int]]:
        depth = self.depth
        if out_indices is not None:
            return out_indices
        if self.out_type == 'avgpool':
            return (depth - 1, )
        return quarter_blocks(depth)

    def frozen_modules(self) -> List[nn.Module]:
        """The patch embedding and the first ``frozen_stages`` blocks with their output norms."""
        return [self.patch_embed, *self.blocks[:max(self.frozen_stages, 0)],
                *self._frozen_out_norms()]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """``x [B, in_channels, H, W]`` (any ``H, W >= 1``) -> a tuple per ``out_type``."""
        self.check_input(x)
        x, hw = self.patch_embed(x)  # [B, N, C]
        outs = []
        last = self.out_indices[-1]
        for i, blk in enumerate(self.blocks[:last + 1]):
            x = run_block(blk, x, hw, with_cp=self.with_cp)
            if i in self.out_indices:
                out = self.out_norm(i)(x)  # [B, N, C]
                if self.out_type == 'avgpool':
                    outs.append(out.mean(dim=1))  # [B, C]
                else:
                    outs.append(tokens_to_map(out, hw))  # [B, C, h, w], channels-last
        if self.pyramid is not None:
            return self.pyramid(outs)
        return tuple(outs)

    # the family's strict Pretrained loading (StrictPretrainedMixin)
    optional_keys = r'(norm\d+|pyramid)\.'  # an ImageNet checkpoint has only the last norm
    prefix_probe = 'patch_embed.proj.weight'
    checkpoint_signature = r'(^|\.)blocks\.\d+\.mlp\.fc1\.token_proj\.weight$'

    def checkpoint_filter(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return checkpoint_filter_weightformer(state_dict)


# official name inside a block -> ours, for the parts that are renamed (the rest keep their names)
_OFFICIAL_DYNAMIC_LINEAR = {'w': 'weight', 'b': 'bias', 'wfm.weight': 'token_proj.weight',
                            'wfm.bias': 'token_proj.bias', 'w1': 'in_basis', 'w2': 'out_basis'}
_OFFICIAL_DYNAMIC_CONV = {'w': 'weight', 'b': 'bias', 'wfm.0.weight': 'kernel_gen.0.weight',
                          'wfm.0.bias': 'kernel_gen.0.bias', 'wfm.2.weight': 'kernel_gen.2.weight'}


def is_official_state_dict(state_dict: Dict[str, torch.Tensor]) -> bool:
    """Whether a state dict uses the official ``model/wfm.py`` key names."""
    return any(k.startswith(('init_norm.', 'module.init_norm.')) or '.linear1.' in k
               for k in state_dict)


def checkpoint_filter_weightformer_official(
        state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map an official WeightFormer checkpoint (any wrapping, DDP ``module.``) to the keys of
    ``ImageClassifier(WeightFormer(arch, out_type='avgpool'), head=LinearClsHead(1000, C))``; pure.
    Unknown keys raise ``ValueError``. The key table: docs/design/weightformer.md.
    """
    sd = strip_module_prefix(unwrap_state_dict(state_dict))
    block_ids = {int(m.group(1)) for m in (re.match(r'blocks\.(\d+)\.', k) for k in sd) if m}
    if not block_ids:
        raise ValueError('Not an official WeightFormer state dict: no blocks.{i}.* keys')
    depth = max(block_ids) + 1
    out, unknown = {}, []
    for k, v in sd.items():
        m = re.match(r'blocks\.(\d+)\.(\w+)\.(.+)$', k)
        if m:
            i, part, rest = int(m.group(1)), m.group(2), m.group(3)
            dst = f'backbone.blocks.{i}.'
            if part in ('norm1', 'norm2'):
                out[dst + f'{part}.{rest}'] = v
            elif part == 'linear2':
                out[dst + f'mlp.fc2.{rest}'] = v
            elif part == 'linear1' and rest in ('weight', 'bias'):
                out[dst + f'mlp.fc1.{rest}'] = v
            elif part == 'linear1' and rest in _OFFICIAL_DYNAMIC_LINEAR:
                # official w is [in, out] (x @ w); ours is nn.Linear's [out, in]
                out[dst + 'mlp.fc1.' + _OFFICIAL_DYNAMIC_LINEAR[rest]] = \
                    v.t().contiguous() if rest == 'w' else v
            elif part == 'dwc' and rest in ('weight', 'bias'):
                out[dst + f'dwc.{rest}'] = v
            elif part == 'dwc' and rest in _OFFICIAL_DYNAMIC_CONV:
                out[dst + 'dwc.' + _OFFICIAL_DYNAMIC_CONV[rest]] = v
            else:
                unknown.append(k)
        elif k.startswith('patch_embed.proj.'):
            out['backbone.' + k] = v
        elif k.startswith('init_norm.'):
            out['backbone.patch_embed.norm.' + k[len('init_norm.'):]] = v
        elif k.startswith('norm.'):
            out[f'backbone.norm{depth - 1}.' + k[len('norm.'):]] = v
        elif k.startswith('head.'):
            out['head.fc.' + k[len('head.'):]] = v
        else:
            unknown.append(k)
    if unknown:
        raise ValueError(f'checkpoint_filter_weightformer_official: {len(unknown)} keys of no '
                         f'official WeightFormer '
                         f'module: {clip_keys(unknown)}')
    return out




def checkpoint_filter_weightformer(
        state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Keys of a checkpoint for :class:`WeightFormer` (pure): official ones go through
    :func:`checkpoint_filter_weightformer_official` (head dropped); others are unwrapped."""
    state_dict = unwrap_state_dict(state_dict)
    if is_official_state_dict(state_dict):
        return {k[len('backbone.'):]: v
                for k, v in checkpoint_filter_weightformer_official(state_dict).items()
                if k.startswith('backbone.')}
    return strip_module_prefix(state_dict)
