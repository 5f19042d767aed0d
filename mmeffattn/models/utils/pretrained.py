"""Strict loading of a backbone's ``Pretrained`` ``init_cfg``: mmengine's ``PretrainedInit``
loads non-strictly without a key filter; here the family's ``checkpoint_filter`` maps the keys and
any mismatch raises an error naming the keys, the likely cause and the fix."""
import re
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import load_state_dict as mmengine_load_state_dict

from ...engine.checkpoint_io import OFFICIAL_STAND_INS, open_checkpoint
from ...registry import MODELS

StateDict = Dict[str, torch.Tensor]


def unwrap_state_dict(ckpt: dict) -> StateDict:
    """The state dict inside an mmengine (``state_dict``) or official (``model``) checkpoint."""
    for key in ('state_dict', 'model'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
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
    return next((k[:-len(probe)] for k in ckpt_keys if k.endswith('.' + probe)), None)


def keys_under(state_dict: StateDict, prefix: str) -> StateDict:
    """The entries under ``prefix`` (``'backbone'`` or ``'backbone.'``), the prefix stripped."""
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def prefixes_of(state_dict: dict) -> List[str]:
    """The first parts of the keys of ``state_dict`` (``['backbone.', 'head.']``)."""
    return sorted({k.split('.', 1)[0] + '.' for k in state_dict})[:20]


def read_checkpoint(checkpoint: str, prefix: Optional[str] = None, map_location: str = 'cpu',
                    what: str = 'checkpoint', prefix_option: str = 'init_cfg prefix') -> StateDict:
    """The state dict of a checkpoint (path or URL), unwrapped, keys under ``prefix`` (stripped);
    a ``RuntimeError`` names the prefixes found (and ``prefix_option``) when none match."""
    if not checkpoint:
        raise ValueError(f'no {what} file given')
    state_dict = unwrap_state_dict(open_checkpoint(checkpoint, map_location,
                                                   extra_safe_globals=OFFICIAL_STAND_INS))
    prefix = prefix and (prefix if prefix.endswith('.') else prefix + '.')
    sub = keys_under(state_dict, prefix) if prefix else state_dict
    if prefix and not sub:
        raise RuntimeError(f'no key of {what} {checkpoint!r} starts with prefix {prefix!r}; its '
                           f'keys start with {prefixes_of(state_dict)}. Set {prefix_option} to '
                           f'one of them, or to None for a bare checkpoint.')
    return sub


def load_state_dict_strict(module: nn.Module, state_dict: StateDict, source: str, *,
                           describe: Optional[str] = None, optional_keys: Optional[str] = None,
                           ignorable_keys: Optional[str] = None, check_shapes: bool = True,
                           hint: Optional[Callable[[List[str], List[str], List[str]], str]] = None,
                           dry_run: bool = False) -> None:
    """Load ``state_dict`` into ``module`` or, before copying anything, raise a ``RuntimeError``
    naming the keys missing, unexpected or mis-shaped, and ``hint(missing, unexpected,
    mismatched)``. ``optional_keys``/``ignorable_keys``: regexes of own keys the file may lack
    and of its keys the model may lack; ``check_shapes=False`` leaves shapes to the module's
    load hooks; ``dry_run`` only checks."""
    logger, cls = MMLogger.get_current_instance(), type(module).__name__
    own = module.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    optional = [k for k in missing if optional_keys and re.match(optional_keys, k)]
    missing = [k for k in missing if k not in optional]
    ignored = [k for k in unexpected if ignorable_keys and re.match(ignorable_keys, k)]
    unexpected = [k for k in unexpected if k not in ignored]
    mismatched = [k for k, v in own.items() if check_shapes and k in state_dict
                  and state_dict[k].shape != v.shape]
    if missing or unexpected or mismatched:
        shapes = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}'
                  for k in mismatched]
        cause = hint(missing, unexpected, mismatched) if hint else ''
        raise RuntimeError(
            f'{source} does not match {describe or cls}: {len(missing)} missing keys '
            f'{clip_keys(missing)}; {len(mismatched)} shape mismatches {clip_keys(shapes)}; '
            f'{len(unexpected)} unexpected keys {clip_keys(unexpected)}.' +
            (f' {cause}' if cause else ''))
    if dry_run:
        return
    if ignored:
        logger.warning(f'{cls}: ignoring {len(ignored)} checkpoint tensors the model does not '
                       f'use (documented): {clip_keys(ignored)}')
    if optional:
        logger.info(f'{cls}: parts not in the checkpoint keep their init: {clip_keys(optional)}')
    try:
        result = module.load_state_dict({k: v for k, v in state_dict.items() if k not in ignored},
                                        strict=False)
    except RuntimeError as e:  # shape mismatches left to the module (check_shapes=False)
        raise RuntimeError(f'{source} does not fit {describe or cls}: {e}') from e
    # load hooks may rename keys: what they report must have been accounted for above
    left = [k for k in result.missing_keys if k not in missing and k not in optional]
    if left or result.unexpected_keys:
        raise RuntimeError(f'{source} does not match {describe or cls} after its load hooks: '
                           f'missing {clip_keys(left)}, unexpected '
                           f'{clip_keys(result.unexpected_keys)}')


def guess_family(keys: List[str], exclude: type) -> Optional[str]:
    """The registered family whose ``checkpoint_signature`` the checkpoint ``keys`` match (and
    ``exclude``'s does not), or None."""
    own = getattr(exclude, 'checkpoint_signature', None)
    if own and any(re.search(own, k) for k in keys):
        return None
    matches = [cls for _, cls in sorted(MODELS.module_dict.items())
               if isinstance(cls, type) and getattr(cls, 'checkpoint_signature', None)
               and not issubclass(exclude, cls)
               and any(re.search(cls.checkpoint_signature, k) for k in keys)]
    # a subclass inherits its base's signature (MILA is SEMA with linear attention): the base
    # names the checkpoint, through its checkpoint_family(keys) where it has one
    for cls in matches:
        if not any(cls is not other and issubclass(cls, other) for other in matches):
            refine = getattr(cls, 'checkpoint_family', None)
            return refine(keys) if refine else cls.__name__
    return None


#: where a WARNING about random backbone weights points the user
WEIGHTS_DOC = 'docs/user_guides/checkpoints.md'


class StrictPretrainedMixin:
    """``init_weights`` of a backbone: ``init_cfg=dict(type='Pretrained', checkpoint=PATH_OR_URL,
    prefix=None, strict=True)`` maps the keys under ``prefix`` with :meth:`checkpoint_filter`
    and loads them with :func:`load_state_dict_strict`; without a checkpoint the random init
    stays, with a WARNING (INFO with ``allow_random=True``, which a backbone frozen whole needs).

    Families set ``optional_keys``, ``ignorable_keys``, ``prefix_probe`` (an own key, to find the
    prefix of a whole-model checkpoint) and ``checkpoint_signature`` (a key regex only theirs
    match).
    """

    optional_keys: Optional[str] = None
    ignorable_keys: Optional[str] = None
    prefix_probe: Optional[str] = None
    checkpoint_signature: Optional[str] = None

    def checkpoint_filter(self, state_dict: StateDict) -> StateDict:
        return strip_module_prefix(unwrap_state_dict(state_dict))

    def describe(self) -> str:
        return f'{self.__class__.__name__}(arch={getattr(self, "arch_settings", "?")})'

    def mismatch_cause(self, missing: List[str], unexpected: List[str],
                       mismatched: List[str]) -> Optional[str]:
        """The likely cause of a mismatch (None: unknown); by default another family's keys."""
        family = guess_family(unexpected, type(self))
        if family:
            return (f'This looks like a {family} checkpoint, not a {type(self).__name__} one: '
                    f'build mmeffattn.{family} for it, or pick a {type(self).__name__} '
                    f'checkpoint.')
        return None

    def init_weights(self) -> None:
        cfgs = [c for c in (self.init_cfg if isinstance(self.init_cfg, list)
                            else [self.init_cfg]) if c is not None]
        pretrained = [c for c in cfgs if c.get('type') == 'Pretrained']
        if len(pretrained) > 1:
            raise ValueError(f'{self.__class__.__name__} got {len(pretrained)} Pretrained '
                             f'init_cfg entries; give one')
        saved, self.init_cfg = self.init_cfg, [c for c in cfgs if c not in pretrained] or None
        try:
            super().init_weights()  # mmengine: the other entries, then the children's own
        finally:
            self.init_cfg = saved
        cfg = pretrained[0] if pretrained else {}
        if cfg.get('checkpoint') is None:
            params = list(self.parameters())
            if cfg and params and not any(p.requires_grad for p in params) and \
                    not cfg.get('allow_random', False):
                # a linear probe without its checkpoint would fit a head on random features
                raise RuntimeError(
                    f'{type(self).__name__}: every parameter is frozen (frozen_stages='
                    f'{self.frozen_stages}) and the Pretrained init_cfg has checkpoint='
                    f'None, so training would fit the rest of the model to random features. Set '
                    f"model.backbone.init_cfg.checkpoint=PATH (the configs' `pretrained`), or "
                    f'model.backbone.init_cfg.allow_random=True for a smoke test.')
            MMLogger.get_current_instance().log(
                20 if cfg.get('allow_random') else 30,
                f'{type(self).__name__}: no pretrained weights, the backbone starts from random '
                f'initialization (a later load_from/--resume of a whole-model checkpoint replaces '
                f"them). To start from weights, set model.backbone.init_cfg=dict(type='Pretrained'"
                f', checkpoint=URL_OR_PATH): official checkpoints load by URL, see {WEIGHTS_DOC}; '
                f'add allow_random=True to that dict to silence this for a run from scratch.')
            return
        unknown = sorted(set(cfg) - {'type', 'checkpoint', 'prefix', 'map_location', 'strict',
                                     'allow_random'})
        if unknown:
            raise ValueError(f'{self.__class__.__name__}: unknown Pretrained init_cfg keys '
                             f'{unknown}; use checkpoint, prefix, map_location, strict')
        self.load_pretrained(cfg['checkpoint'], cfg.get('prefix'),
                             cfg.get('map_location', 'cpu'), cfg.get('strict', True))

    def load_pretrained(self, checkpoint: str, prefix: Optional[str] = None,
                        map_location: str = 'cpu', strict: bool = True) -> None:
        """Load a checkpoint (path or URL) strictly. A checkpoint with no key under ``prefix``
        is read whole: an official one is bare, and the family's filter converts it."""
        if re.match(r'(open-?mmlab|torchvision|mmcls|mmpretrain)://', str(checkpoint)):
            raise RuntimeError(  # (not downloaded)
                f'Pretrained checkpoint {checkpoint!r} names weights of another architecture (an '
                f'OpenMMLab / torchvision model-zoo checkpoint), usually the model-level '
                f'pretrained of a stock mmseg/mmdet config: set model.pretrained=None '
                f"(--cfg-options model.pretrained=None) and give the backbone init_cfg=dict(type="
                f"'Pretrained', checkpoint=PATH) of its own weights, or None (from scratch).")
        raw = read_checkpoint(checkpoint, None, map_location)
        sub = keys_under(raw, prefix) if prefix else raw
        source, whole = f'Checkpoint {checkpoint!r}', not sub
        if whole:
            source += (f' (no key of it starts with prefix {prefix!r}, its keys start with '
                       f'{prefixes_of(raw)}, so it was read whole)')
            sub, prefix = raw, None
        state_dict = self.checkpoint_filter(sub)
        if not strict:  # what mmengine's PretrainedInit does: load what fits, log the rest
            mmengine_load_state_dict(self, state_dict, strict=False, logger='current')
            return
        load_state_dict_strict(
            self, state_dict, source, describe=self.describe(), optional_keys=self.optional_keys,
            ignorable_keys=self.ignorable_keys,
            hint=lambda m, u, s: self._mismatch_hint(m, u, s, prefix, state_dict))
        converted = set(state_dict) != set(strip_module_prefix(sub))
        MMLogger.get_current_instance().info(
            f'{self.__class__.__name__}: loaded {len(state_dict)} tensors from {checkpoint!r}' +
            (f' (prefix {prefix!r})' if prefix else ' (whole)' if whole else '') +
            (f', its keys converted by {type(self).__name__}.checkpoint_filter (official layouts: '
             f'{WEIGHTS_DOC})' if converted else ''))

    def fitting_archs(self, state_dict: StateDict) -> List[str]:
        """The ``arch_zoo`` entries whose model (default options, on the meta device) has the
        checkpoint's keys and shapes, up to :attr:`optional_keys` and :attr:`ignorable_keys`."""
        def skip(pattern, k):
            return bool(pattern and re.search(pattern, k))
        want = {k: tuple(v.shape) for k, v in state_dict.items()
                if not skip(self.ignorable_keys, k)}
        names, seen = [], []
        for name, settings in (getattr(type(self), 'arch_zoo', None) or {}).items():
            if settings in seen:  # an alias ('t' and 'tiny')
                continue
            seen.append(settings)
            try:
                with torch.device('meta'):
                    model = type(self)(arch=name)
                have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            except Exception:  # an arch that needs other options: no guess from it
                continue
            if all(have.get(k) == s for k, s in want.items()) and \
                    all(k in want for k in have if not skip(self.optional_keys, k)):
                names.append(name)
        return names

    def _mismatch_hint(self, missing: List[str], unexpected: List[str], mismatched: List[str],
                       prefix: Optional[str], state_dict: StateDict) -> str:
        found = guess_prefix(self.prefix_probe, unexpected) if missing else None
        # (almost) no shared key, of no family of ours, under no other prefix: foreign weights
        foreign = bool(unexpected) and len(missing) >= 0.9 * len(self.state_dict()) and \
            guess_family(unexpected, type(self)) is None and not found
        cause = None if foreign else self.mismatch_cause(missing, unexpected, mismatched)
        if foreign:
            cause = (f'The checkpoint shares almost no key with {type(self).__name__}: these look '
                     f'like weights of another architecture (from the model-level pretrained of '
                     f'a stock mmseg/mmdet config? then set model.pretrained=None).')
        elif cause is None and not found:
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
        else:
            fix = f'Check that prefix {prefix!r} selects the backbone' if prefix else \
                'Check the checkpoint'
        return ((cause + ' ') if cause else '') + (
            f'{fix}, and that the model options (arch, ...) match the checkpoint; '
            f"init_cfg=dict(type='Pretrained', ..., strict=False) loads what fits.")
