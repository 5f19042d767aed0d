"""What every backbone family shares (OpenMMLab's ``BaseBackbone`` role): ``arch`` parsing, the
training switches, the strict ``Pretrained`` ``init_cfg``, per-output norms and input checks."""
import warnings
from abc import ABCMeta
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule

from ...engine.checkpoint_io import warn_if_mmengine_cannot_load
from ...registry import MODELS
from ..layers.recompute import checkpoint_contexts
from ..utils import FreezeStagesMixin, StrictPretrainedMixin, parse_out_indices, resolve_arch

__all__ = ['BaseBackbone', 'HWShape', 'drop_path_rates', 'quarter_blocks', 'run_block',
           'backbone_families']

HWShape = Tuple[int, int]


def quarter_blocks(depth: int) -> Tuple[int, ...]:
    """The last block of each quarter of a single-stage trunk of ``depth`` blocks (fewer than
    four indices under four blocks): its default ``out_indices`` for a pyramid."""
    return tuple(sorted({max((k + 1) * depth // 4 - 1, 0) for k in range(4)}))


def drop_path_rates(rate: float, n: int) -> List[float]:
    """Stochastic depth rising linearly from 0 to ``rate`` over ``n`` blocks (on the CPU, so a
    ``meta``-device build works)."""
    return torch.linspace(0, rate, n, device='cpu').tolist()


def run_block(blk: nn.Module, x: torch.Tensor, *args, with_cp: bool = False) -> torch.Tensor:
    """``blk(x, *args)``, gradient-checkpointed when ``with_cp`` and gradients are needed; the
    recomputation runs under :func:`~mmeffattn.models.layers.recompute.recomputing`."""
    if with_cp and torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in blk.parameters())):
        return cp.checkpoint(blk, x, *args, use_reentrant=False, context_fn=checkpoint_contexts)
    return blk(x, *args)


class _TakesPretrained(ABCMeta):
    """Every backbone takes ``pretrained=PATH_OR_URL`` (mmseg's segmentors pass it), the
    deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``."""

    def __call__(cls, *args, pretrained: Optional[str] = None, **kwargs):
        if pretrained is None:
            return super().__call__(*args, **kwargs)
        if not isinstance(pretrained, str):
            raise TypeError(f'{cls.__name__}: pretrained must be a checkpoint path/URL or None, '
                            f'got {type(pretrained).__name__}')
        if kwargs.get('init_cfg') is not None:
            raise ValueError(
                f"{cls.__name__} got both pretrained={pretrained!r} and init_cfg="
                f"{kwargs['init_cfg']!r}; give one: init_cfg=dict(type='Pretrained', checkpoint="
                f"...), or model.pretrained=None for a stock config's model.pretrained.")
        warnings.warn(f"{cls.__name__}: pretrained is deprecated; use init_cfg=dict(type="
                      f"'Pretrained', checkpoint={pretrained!r})", DeprecationWarning, stacklevel=2)
        return super().__call__(*args, **kwargs, init_cfg=dict(type='Pretrained',
                                                               checkpoint=pretrained))


class BaseBackbone(StrictPretrainedMixin, FreezeStagesMixin, BaseModule,
                   metaclass=_TakesPretrained):
    """Base of the backbone families (docs/developer/adding_a_family.md).

    Args:
        arch: a key of :attr:`arch_zoo` (case-insensitive) or a dict with :attr:`arch_keys`.
        in_channels: image channels.
        init_cfg: mmengine init config (``type='Pretrained'`` loads strictly).
        pretrained: deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
    """

    #: the variants, ``name -> settings``
    arch_zoo: Dict[str, dict] = {}
    #: keys a custom arch dict must give
    arch_keys: Tuple[str, ...] = ()
    #: values of the optional keys a custom arch dict may leave out
    arch_defaults: Optional[Dict[str, object]] = None
    #: the smallest arch (a dict) that runs every code path: what the contract tests build
    mini_arch: Optional[dict] = None
    mini_kwargs: Dict[str, object] = {}
    #: per-output LayerNorm epsilon
    out_norm_eps: float = 1e-5

    def __init__(self, arch: Union[str, dict], in_channels: int = 3,
                 init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        warn_if_mmengine_cannot_load()  # a stock run's log names the fix before loading fails
        self.arch_settings = self._parse_arch(arch)
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f'in_channels must be an integer >= 1, got {in_channels!r}')
        self.in_channels = in_channels

    @classmethod
    def _parse_arch(cls, arch: Union[str, dict]) -> dict:
        """A copy of the settings ``arch`` names or gives, checked by :meth:`_check_arch`."""
        settings = resolve_arch(cls.__name__, arch, cls.arch_zoo, cls.arch_keys,
                                defaults=cls.arch_defaults)
        return cls._check_arch(settings)

    @classmethod
    def _check_arch(cls, arch: dict) -> dict:
        """Family-specific checks of resolved arch settings; here, a trunk's ``depth``."""
        if 'depth' in arch and arch['depth'] < 1:
            raise ValueError(f"arch 'depth' must be >= 1, got {arch['depth']}")
        return arch

    def _init_training_switches(self, out_indices: Union[int, Sequence[int]], num: int,
                                what: str, frozen_stages: int, norm_eval: bool,
                                with_cp: bool) -> None:
        """Set ``out_indices`` (into ``num`` stages/blocks), ``frozen_stages`` (range-checked:
        -1 .. ``num``), ``norm_eval`` and ``with_cp``."""
        self.out_indices = parse_out_indices(out_indices, num, what)
        if isinstance(frozen_stages, bool) or not isinstance(frozen_stages, int) or \
                not -1 <= frozen_stages <= num:
            raise ValueError(f'frozen_stages must be an integer in [-1, {num}] ({num} {what}), '
                             f'got {frozen_stages!r}')
        self.frozen_stages = frozen_stages
        self.num_freezable = num  # the largest frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp

    def _add_out_norms(self, channels: Union[int, Sequence[int]]) -> None:
        """One LayerNorm ``norm{i}`` per output index (``channels``: one width, or one per
        stage)."""
        for i in self.out_indices:
            c = channels if isinstance(channels, int) else channels[i]
            self.add_module(f'norm{i}', nn.LayerNorm(c, eps=self.out_norm_eps))

    def out_norm(self, i: int) -> nn.Module:
        """The output norm of output index ``i``."""
        return getattr(self, f'norm{i}')

    def _frozen_out_norms(self) -> List[nn.Module]:
        return [self.out_norm(i) for i in range(self.frozen_stages) if i in self.out_indices]

    def check_input(self, x: torch.Tensor) -> None:
        """Raise one clear error for an input the backbone cannot take: not ``[B, in_channels, H,
        W]``, empty, not float, or on another dtype/device than the weights (outside autocast)."""
        name = type(self).__name__
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        if not torch.is_tensor(x) or x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{name} expects an input of shape [B, {self.in_channels}, H, W], '
                             f'got {shape}')
        if x.numel() == 0:
            raise ValueError(f'{name} got an empty input of shape {shape}: it needs at least one '
                             f'image (B >= 1) of at least 1x1 pixels; skip empty batches before '
                             f'the model')
        if not x.is_floating_point():
            raise TypeError(f'{name} expects a floating-point image, got {x.dtype}: convert it '
                            f'(x.float(), normalized as the data preprocessor does)')
        ref = next((p for p in self.parameters() if p.is_floating_point()), None)
        if ref is None or ref.device.type == 'meta':
            return
        if x.device != ref.device:
            raise ValueError(f'{name} weights are on {ref.device} but the input is on '
                             f'{x.device}: move one of them (model.to(x.device))')
        if x.dtype != ref.dtype and not torch.is_autocast_enabled(x.device.type):
            # autocast takes only 16-bit dtypes (fp16/bf16 on a GPU, bf16 on the CPU)
            autocast = (f"run it under torch.autocast('{x.device.type}', dtype={x.dtype}), "
                        if x.dtype in (torch.float16, torch.bfloat16) else '')
            raise TypeError(
                f'{name} has {ref.dtype} weights but got a {x.dtype} input: {autocast}convert '
                f'the model (model.to({x.dtype})), or convert the input (x.to({ref.dtype}))')


def backbone_families() -> Dict[str, type]:
    """Every registered backbone family (``MODELS`` name -> class), for tests and tools."""
    return {name: cls for name, cls in sorted(MODELS.module_dict.items())
            if isinstance(cls, type) and issubclass(cls, BaseBackbone)}
