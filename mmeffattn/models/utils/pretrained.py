"""Strict, helpful loading of checkpoints, shared by every family and load path.

mmengine's ``PretrainedInit`` loads non-strictly and only logs mismatches, so a wrong prefix,
arch or family silently trains from partly random weights. Here a missing, unexpected or
mis-shaped key raises an error naming the keys, the likely cause and the fix (``strict=False``
loads what fits and logs what it ignored). One loader serves the backbones' ``Pretrained``
``init_cfg`` (:class:`StrictPretrainedMixin`), the VECA distiller's teacher and the converters,
and converts the authors' checkpoints (:data:`OFFICIAL_LAYOUTS`) with each family's converter.
"""
import re
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from ...engine.checkpoint_io import OFFICIAL_STAND_INS, open_checkpoint
from ...registry import MODELS

StateDict = Dict[str, torch.Tensor]


def unwrap_state_dict(ckpt: dict) -> StateDict:
    """The state dict inside an mmengine (``state_dict``) or official (``model``) checkpoint."""
    for key in ('state_dict', 'model'):
        if isinstance(ckpt, dict) and key in ckpt and isinstance(ckpt[key], dict):
            return ckpt[key]
    return ckpt


def strip_key_prefix(key: str, prefixes: Tuple[str, ...] = ('module.', )) -> str:
    """``key`` without the wrapper prefixes (DDP's ``module.``...), each stripped once, in order."""
    for p in prefixes:
        if key.startswith(p):
            key = key[len(p):]
    return key


def strip_module_prefix(state_dict: StateDict,
                        prefixes: Tuple[str, ...] = ('module.', )) -> StateDict:
    """A new state dict whose keys lose a DDP ``module.`` prefix (or the given ``prefixes``)."""
    return {strip_key_prefix(k, prefixes): v for k, v in state_dict.items()}


def clip_keys(keys: List[str], n: int = 12) -> str:
    """``keys`` as a list string, shortened to ``n`` entries."""
    return str(keys[:n])[:-1] + (f', ... {len(keys) - n} more]' if len(keys) > n else ']')


def guess_prefix(probe: Optional[str], ckpt_keys: List[str]) -> Optional[str]:
    """The prefix under which a checkpoint holds the key ``probe`` (e.g. ``'backbone.'``)."""
    if probe is None or probe in ckpt_keys:
        return None
    for k in ckpt_keys:
        if k.endswith('.' + probe):
            return k[:-len(probe)]
    return None


#: model-zoo schemes of mmengine's CheckpointLoader: weights of OpenMMLab's/torchvision's own
#: architectures, never of an mmeffattn backbone
FOREIGN_ZOO_SCHEMES = ('open-mmlab://', 'openmmlab://', 'torchvision://', 'mmcls://',
                       'mmpretrain://')


def check_not_foreign_zoo(checkpoint: str, what: str = 'checkpoint') -> None:
    """Raise for an OpenMMLab/torchvision model-zoo name: weights of another architecture than an
    mmeffattn backbone (not downloaded)."""
    if isinstance(checkpoint, str) and checkpoint.startswith(FOREIGN_ZOO_SCHEMES):
        raise RuntimeError(
            f'{what} {checkpoint!r} names weights of another architecture (an OpenMMLab / '
            f'torchvision model-zoo checkpoint), which cannot load into an mmeffattn backbone '
            f'(and is not downloaded). It usually comes from the model-level pretrained of a '
            f'stock mmseg/mmdet config: set model.pretrained=None (--cfg-options '
            f"model.pretrained=None) and give the backbone init_cfg=dict(type='Pretrained', "
            f'checkpoint=PATH) of its own weights, or None to train from scratch.')


def select_prefix(state_dict: StateDict, prefix: Optional[str], checkpoint: str,
                  what: str = 'checkpoint', prefix_option: str = 'init_cfg prefix',
                  bare_name: str = 'bare') -> StateDict:
    """The keys of ``state_dict`` under ``prefix`` (stripped); all of them for no prefix.

    Raises ``RuntimeError`` naming the prefixes found and ``prefix_option`` when none match.
    """
    if not prefix:
        return state_dict
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not sub:
        heads = sorted({k.split('.', 1)[0] + '.' for k in state_dict})
        raise RuntimeError(
            f'no key of {what} {checkpoint!r} starts with prefix {prefix!r}; its keys start '
            f'with {heads[:20]}. Set {prefix_option} to one of them, or to None for a '
            f'{bare_name} checkpoint.')
    return sub


def read_checkpoint(checkpoint: str, prefix: Optional[str] = None, map_location: str = 'cpu',
                    what: str = 'checkpoint', prefix_option: str = 'init_cfg prefix',
                    bare_name: str = 'bare') -> StateDict:
    """The state dict of a checkpoint (path or URL), unwrapped, keys under ``prefix`` (stripped).

    Raises:
        RuntimeError: no key under ``prefix`` (naming the prefixes found and ``prefix_option``),
            or :class:`CheckpointError` for an unreadable file or URL.
    """
    if not checkpoint:
        raise ValueError(f'no {what} file given')
    # (official training checkpoints carry their yacs config: read as a plain dict)
    state_dict = unwrap_state_dict(open_checkpoint(checkpoint, map_location,
                                                   extra_safe_globals=OFFICIAL_STAND_INS))
    return select_prefix(state_dict, prefix, checkpoint, what, prefix_option, bare_name)


def load_state_dict_strict(module: nn.Module, state_dict: StateDict, source: str, *,
                           describe: Optional[str] = None,
                           optional_keys: Optional[str] = None,
                           ignorable_keys: Optional[str] = None,
                           strict: bool = True,
                           check_shapes: bool = True,
                           hint: Optional[Callable[[List[str], List[str], List[str]], str]] = None,
                           logger: Optional[MMLogger] = None, dry_run: bool = False) -> None:
    """Load ``state_dict`` into ``module``; raise on any key or shape that does not match.

    Nothing is copied before the checks pass, so a failed load leaves ``module`` unchanged.

    Args:
        module: the model to load into.
        state_dict: the (filtered) checkpoint tensors.
        source: how errors name the checkpoint (``"checkpoint 'x.pth'"``).
        describe: how errors name the model (default: its class name).
        optional_keys: regex of own keys a checkpoint may lack; they keep their init (INFO).
        ignorable_keys: regex of checkpoint keys the model may deliberately lack (WARNING).
        strict: ``False`` loads what fits and logs how many tensors were ignored.
        check_shapes: ``False`` leaves shapes to ``module.load_state_dict`` (for load hooks that
            resize tensors); its size-mismatch error is re-raised naming ``source``.
        hint: ``(missing, unexpected, mismatched) -> str``, the likely cause and fix.
        logger: where to log (default: the current ``MMLogger``).
        dry_run: only check (e.g. against a model on the meta device).

    Raises:
        RuntimeError: missing, unexpected or mismatched keys (with ``strict=True``).
    """
    logger = logger or MMLogger.get_current_instance()
    name = describe or type(module).__name__
    own = module.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    optional = [k for k in missing if optional_keys and re.match(optional_keys, k)]
    missing = [k for k in missing if k not in optional]
    ignored = [k for k in unexpected if ignorable_keys and re.match(ignorable_keys, k)]
    unexpected = [k for k in unexpected if k not in ignored]
    mismatched = [k for k, v in own.items() if check_shapes and k in state_dict
                  and state_dict[k].shape != v.shape]
    if strict and (missing or unexpected or mismatched):
        shapes = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}'
                  for k in mismatched]
        cause = hint(missing, unexpected, mismatched) if hint else ''
        raise RuntimeError(
            f'{source} does not match {name}: {len(missing)} missing keys {clip_keys(missing)}; '
            f'{len(mismatched)} shape mismatches {clip_keys(shapes)}; {len(unexpected)} '
            f'unexpected keys {clip_keys(unexpected)}.' + (f' {cause}' if cause else ''))
    if dry_run:
        return
    skip = set(ignored) | set(unexpected if not strict else []) | set(mismatched)
    to_load = {k: v for k, v in state_dict.items() if k not in skip}
    if ignored:
        logger.warning(f'{type(module).__name__}: ignoring {len(ignored)} checkpoint tensors the '
                       f'model does not use (documented): {clip_keys(ignored)}')
    if not strict and (missing or unexpected or mismatched):
        logger.warning(
            f'{type(module).__name__}: strict=False: ignored {len(unexpected) + len(mismatched)} '
            f'of the {len(state_dict)} tensors of {source} ({len(unexpected)} unexpected '
            f'{clip_keys(unexpected, 5)}, {len(mismatched)} shape mismatches '
            f'{clip_keys(mismatched, 5)}); {len(missing)} model tensors keep their init '
            f'{clip_keys(missing, 5)}')
    if optional:
        logger.info(f'{type(module).__name__}: parts not in the checkpoint keep their init: '
                    f'{clip_keys(optional)}')
    try:
        result = module.load_state_dict(to_load, strict=False)
    except RuntimeError as e:  # shape mismatches left to the module (check_shapes=False)
        raise RuntimeError(f'{source} does not fit {name}: {e}') from e
    # load hooks may rename keys: what they report must have been accounted for above
    left = [k for k in result.missing_keys if k not in missing and k not in optional]
    if strict and (left or result.unexpected_keys):
        raise RuntimeError(f'{source} does not match {name} after its load hooks: missing '
                           f'{clip_keys(left)}, unexpected {clip_keys(result.unexpected_keys)}')


def guess_family(keys: List[str], exclude: type) -> Optional[str]:
    """The registered family whose ``checkpoint_signature`` the checkpoint ``keys`` match (and
    ``exclude``'s does not), or None."""
    own = getattr(exclude, 'checkpoint_signature', None)
    if own and any(re.search(own, k) for k in keys):
        return None
    families = {name: cls for name, cls in sorted(MODELS.module_dict.items())
                if isinstance(cls, type) and getattr(cls, 'checkpoint_signature', None)}
    matches = [(name, cls) for name, cls in families.items() if not issubclass(exclude, cls)
               and any(re.search(cls.checkpoint_signature, k) for k in keys)]
    # a subclass inherits its base's signature (MILA is SEMA with linear attention): the base
    # names the checkpoint, through its checkpoint_family(keys) where it has one
    for name, cls in matches:
        if not any(cls is not other and issubclass(cls, other) for _, other in matches):
            refine = getattr(cls, 'checkpoint_family', None)
            return refine(keys) if refine else name
    return None


class OfficialLayout(NamedTuple):
    """How to recognise and convert one family's official checkpoints.

    Attributes:
        name: how logs name the layout.
        source: where the official code (and the weights) live.
        families: class names (``__mro__``) of the backbones it loads into.
        detect: ``state_dict -> bool``, or that function's name in the family's module.
        convert: name of the converter ``state_dict -> state_dict`` in the family's module.
        backbone_prefix: prefix of the backbone keys in the converter's output ('' for none).
    """
    name: str
    source: str
    families: Tuple[str, ...]
    detect: Union[Callable[[StateDict], bool], str]
    convert: str
    backbone_prefix: str = ''


def is_official_mlla(state_dict: StateDict) -> bool:
    """Whether a state dict is an official MLLA/MILA classification checkpoint: the MLLA key
    names with the classifier (``head.*``), the classification norm (``norm.*``) or the
    fixed-size RoPE tables (``*.attn.rope.rotations``) that the backbone does not have."""
    keys = list(strip_module_prefix(unwrap_state_dict(state_dict)))
    mlla = any(re.match(r'layers\.\d+\.blocks\.\d+\.', k) for k in keys) and \
        any(k.startswith('patch_embed.conv1.') for k in keys)
    return mlla and any(k.startswith(('head.', 'norm.')) or k.endswith('attn.rope.rotations')
                        for k in keys)


#: the official layouts, checked in this order
OFFICIAL_LAYOUTS = (
    OfficialLayout('MLLA', 'github.com/LeapLabTHU/MLLA', ('SEMA', 'MILA'),
                   detect=is_official_mlla, convert='checkpoint_filter_mlla'),
    OfficialLayout('WeightFormer', 'github.com/LeapLabTHU/WeightFormer (model/wfm.py)',
                   ('WeightFormer', ), detect='is_official_state_dict',
                   convert='checkpoint_filter_weightformer_official',
                   backbone_prefix='backbone.'),
    OfficialLayout('VECA', 'github.com/alansong1322/VECA (veca/model.py)', ('VECA', ),
                   detect='is_official_state_dict', convert='checkpoint_filter_veca_official',
                   backbone_prefix='backbone.'),
)


def family_function(model: type, name: str, layout: OfficialLayout) -> Callable:
    """The function ``name`` of the module that defines ``model`` or the family class it
    derives from (the class named in ``layout.families``): the family's own converter."""
    for cls in model.__mro__:
        if cls.__name__ in layout.families:
            fn = getattr(sys.modules.get(cls.__module__), name, None)
            if callable(fn):
                return fn
    raise LookupError(f'{model.__name__}: no function {name!r} in the module of its family '
                      f'{layout.families} (the {layout.name} converter)')


def official_layout_of(model: type, state_dict: dict) -> Optional[OfficialLayout]:
    """The official layout of ``state_dict`` for a backbone class ``model``, or None."""
    names = {c.__name__ for c in model.__mro__}
    for layout in OFFICIAL_LAYOUTS:
        if names.intersection(layout.families):
            sd = state_dict.get('student', state_dict)  # VECA training checkpoints
            detect = layout.detect if callable(layout.detect) else \
                family_function(model, layout.detect, layout)
            if isinstance(sd, dict) and detect(unwrap_state_dict(sd)):
                return layout
    return None


def convert_official(model: type, state_dict: dict
                     ) -> Tuple[dict, Optional[OfficialLayout], Optional[Callable]]:
    """``(backbone state dict, layout, converter)`` if ``state_dict`` is an official checkpoint of
    the family of ``model`` (converted by the family's converter, backbone keys only), else
    ``(state_dict, None, None)`` unchanged."""
    layout = official_layout_of(model, state_dict)
    if layout is None:
        return state_dict, None, None
    convert = family_function(model, layout.convert, layout)
    out = convert(state_dict)
    if layout.backbone_prefix:
        p = layout.backbone_prefix
        out = {k[len(p):]: v for k, v in out.items() if k.startswith(p)}
    return out, layout, convert


#: where a WARNING about random backbone weights points the user
WEIGHTS_DOC = 'docs/user_guides/checkpoints.md'


class StrictPretrainedMixin:
    """``init_weights`` for an mmengine ``BaseModule`` backbone with a strict ``Pretrained`` load.

    ``init_cfg=dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, strict=True)`` reads,
    unwraps and converts the checkpoint, keeps the keys under ``prefix``, maps them with
    :meth:`checkpoint_filter` and loads them with :func:`load_state_dict_strict`. Without a
    checkpoint the random init is kept with a WARNING (INFO with ``allow_random=True``, which a
    backbone frozen whole requires).

    Subclasses set:
        optional_keys, ignorable_keys: see :func:`load_state_dict_strict`.
        prefix_probe: an own key used to detect the prefix of a whole-model checkpoint.
        checkpoint_signature: regex of a key only this family's checkpoints have.
        official_name: how error messages name a bare checkpoint of the family.

    They may override :meth:`checkpoint_filter`, :meth:`describe` and :meth:`mismatch_cause`.
    """

    optional_keys: Optional[str] = None
    ignorable_keys: Optional[str] = None
    prefix_probe: Optional[str] = None
    checkpoint_signature: Optional[str] = None
    official_name: str = 'backbone/classification'

    def checkpoint_filter(self, state_dict: StateDict) -> StateDict:
        return strip_module_prefix(unwrap_state_dict(state_dict))

    def describe(self) -> str:
        return f'{self.__class__.__name__}(arch={getattr(self, "arch_settings", "?")})'

    def mismatch_cause(self, missing: List[str], unexpected: List[str],
                       mismatched: List[str]) -> Optional[str]:
        """The likely cause of a mismatch, from the keys (None: unknown). By default: the
        checkpoint of another registered family."""
        family = guess_family(unexpected, type(self))
        if family:
            return (f'This looks like a {family} checkpoint, not a {type(self).__name__} one: '
                    f'build mmeffattn.{family} for it, or pick a {type(self).__name__} '
                    f'checkpoint.')
        return None

    def init_weights(self) -> None:
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        cfgs = [c for c in cfgs if c is not None]
        pretrained = [c for c in cfgs if c.get('type') == 'Pretrained']
        if len(pretrained) > 1:
            raise ValueError(f'{self.__class__.__name__} got {len(pretrained)} Pretrained '
                             f'init_cfg entries; give one')
        if not pretrained:
            super().init_weights()
            self._say_random_weights(allow_random=False)
            return
        others = [c for c in cfgs if c.get('type') != 'Pretrained']
        saved, self.init_cfg = self.init_cfg, (others or None)
        try:
            super().init_weights()
        finally:
            self.init_cfg = saved
        cfg = pretrained[0]
        if cfg.get('checkpoint') is None:
            params = list(self.parameters())
            if params and not any(p.requires_grad for p in params) and \
                    not cfg.get('allow_random', False):
                # a linear probe without its checkpoint would fit a head on random features
                raise RuntimeError(
                    f'{self.__class__.__name__}: every parameter is frozen (frozen_stages='
                    f'{getattr(self, "frozen_stages", "?")}) and the Pretrained init_cfg has '
                    f'checkpoint=None, so training would fit the rest of the model to random '
                    f'features. Set model.backbone.init_cfg.checkpoint=PATH (the configs\' '
                    f'`pretrained`), or model.backbone.init_cfg.allow_random=True for a smoke '
                    f'test.')
            # configs name the entry with checkpoint=None so that one --cfg-options key switches
            # ImageNet weights on; until then the backbone trains from scratch
            self._say_random_weights(allow_random=cfg.get('allow_random', False))
            return
        unknown = sorted(set(cfg) - {'type', 'checkpoint', 'prefix', 'map_location', 'strict',
                                     'allow_random'})
        if unknown:
            raise ValueError(f'{self.__class__.__name__}: unknown Pretrained init_cfg keys '
                             f'{unknown}; use checkpoint, prefix, map_location, strict '
                             f'(allow_random: a fully frozen backbone without a checkpoint)')
        self.load_pretrained(cfg['checkpoint'], prefix=cfg.get('prefix'),
                             map_location=cfg.get('map_location', 'cpu'),
                             strict=cfg.get('strict', True))

    def _say_random_weights(self, allow_random: bool) -> None:
        """Log that the backbone starts from random weights, and where weights come from: at
        WARNING level, or INFO when ``allow_random=True`` says it is meant."""
        msg = (f'{self.__class__.__name__}: no pretrained weights, the backbone starts from '
               f'random initialization (a later load_from/--resume of a whole-model checkpoint '
               f"replaces them). To start from weights, set model.backbone.init_cfg=dict(type="
               f"'Pretrained', checkpoint=URL_OR_PATH): official checkpoints load by URL, see "
               f'{WEIGHTS_DOC}; add allow_random=True to that dict to silence this for a run '
               f'from scratch.')
        MMLogger.get_current_instance().log(20 if allow_random else 30, msg)

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', strict: bool = True) -> None:
        """Load a checkpoint (path or URL) strictly; an official checkpoint of the family is
        recognised and converted (``prefix`` then does not apply)."""
        if not checkpoint:
            raise ValueError("init_cfg=dict(type='Pretrained') needs a 'checkpoint'")
        logger = MMLogger.get_current_instance()
        check_not_foreign_zoo(checkpoint, 'Pretrained checkpoint')
        state_dict = read_checkpoint(checkpoint, None, map_location)
        state_dict, layout, convert = convert_official(type(self), state_dict)
        if layout is not None:
            # an official checkpoint is bare: a prefix (our configs' 'backbone.') selects nothing
            logger.info(f'{self.__class__.__name__}: {checkpoint!r} is an official {layout.name} '
                        f'checkpoint ({layout.source}); converted it on load with '
                        f'{convert.__module__}.{convert.__qualname__}' +
                        (f' (init_cfg prefix {prefix!r} not used)' if prefix else ''))
            prefix = None
        else:
            state_dict = select_prefix(state_dict, prefix, checkpoint,
                                       prefix_option='init_cfg prefix',
                                       bare_name=self.official_name)
        state_dict = self.checkpoint_filter(state_dict)
        if prefix:
            prefix = prefix if prefix.endswith('.') else prefix + '.'
        load_state_dict_strict(
            self, state_dict, f'Checkpoint {checkpoint!r}', describe=self.describe(),
            optional_keys=self.optional_keys, ignorable_keys=self.ignorable_keys, strict=strict,
            hint=lambda m, u, s: self._mismatch_hint(m, u, s, prefix, state_dict), logger=logger)
        logger.info(f'{self.__class__.__name__}: loaded {len(state_dict)} tensors from '
                    f'{checkpoint!r}' + (f' (prefix {prefix!r})' if prefix else ''))

    def fitting_archs(self, state_dict: StateDict) -> List[str]:
        """The ``arch_zoo`` entries whose model (this class, default options otherwise) has
        exactly the checkpoint's keys and shapes, up to :attr:`optional_keys` the checkpoint
        may lack and :attr:`ignorable_keys` it may add; built on the meta device (no memory)."""
        want = {k: tuple(v.shape) for k, v in state_dict.items()
                if not (self.ignorable_keys and re.search(self.ignorable_keys, k))}
        names, seen = [], []
        for name, settings in (getattr(type(self), 'arch_zoo', None) or {}).items():
            if settings in seen:  # an alias ('t' and 'tiny')
                continue
            seen.append(settings)
            try:
                with torch.device('meta'):
                    model = type(self)(arch=name)
            except Exception:  # an arch that needs other options: no guess from it
                continue
            have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            if all(have.get(k) == shape for k, shape in want.items()) and all(
                    k in want for k in have
                    if not (self.optional_keys and re.search(self.optional_keys, k))):
                names.append(name)
        return names

    def _mismatch_hint(self, missing: List[str], unexpected: List[str], mismatched: List[str],
                       prefix: Optional[str], state_dict: Optional[StateDict] = None) -> str:
        found = guess_prefix(self.prefix_probe, unexpected) if missing else None
        # a checkpoint sharing (almost) no key with the model, of no family of ours and not
        # the model under another prefix: foreign weights (checked first: a family's own guess
        # assumes a near miss)
        foreign = bool(unexpected) and len(missing) >= 0.9 * len(self.state_dict()) and \
            guess_family(unexpected, type(self)) is None and not found
        cause = None if foreign else self.mismatch_cause(missing, unexpected, mismatched)
        if foreign:
            cause = (f'The checkpoint shares almost no key with {type(self).__name__}: these look '
                     f'like weights of another architecture (from the model-level pretrained of '
                     f'a stock mmseg/mmdet config? then set model.pretrained=None).')
        elif cause is None and state_dict is not None and not found:
            archs = self.fitting_archs(state_dict)
            if archs:
                cause = (f'The checkpoint fits {type(self).__name__}(arch='
                         f"{' or '.join(repr(a) for a in archs)}), not this model "
                         f'({self.describe()}): build that arch.')
        if found:
            fix = (f'The backbone weights seem to lie under {found!r}: set '
                   f"init_cfg=dict(type='Pretrained', checkpoint=..., prefix={found!r})")
        elif not prefix and missing:
            fix = ('If the checkpoint holds a whole classifier/detector/segmentor, set '
                   "init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')")
        elif prefix:
            fix = f'Check that prefix {prefix!r} selects the backbone'
        else:
            fix = 'Check the checkpoint'
        return ((cause + ' ') if cause else '') + (
            f'{fix}, and that the model options (arch, ...) match the checkpoint; '
            f"init_cfg=dict(type='Pretrained', ..., strict=False) loads what fits.")
