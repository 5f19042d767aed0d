"""``arch`` resolution shared by the backbones: a name from the class's ``arch_zoo`` or a dict."""
import copy
from typing import Iterable, Mapping, Optional, Union


def resolve_arch(owner: str, arch: Union[str, dict], arch_zoo: Mapping[str, dict],
                 essential: Iterable[str], defaults: Optional[Mapping] = None) -> dict:
    """A fresh copy of the settings ``arch`` names (a key of ``arch_zoo``, any case) or gives (a
    dict with the ``essential`` keys, ``defaults`` filled in); ``owner`` names the class in the
    ``KeyError``/``ValueError`` of an unknown name or a bad dict."""
    essential = sorted(essential)
    optional = f' (optional: {sorted(defaults)})' if defaults else ''
    if isinstance(arch, str):
        key = arch.lower()
        if key not in arch_zoo:
            raise KeyError(f'Unknown arch {arch!r} for {owner}; choose one of {sorted(arch_zoo)} '
                           f'or pass a dict with keys {essential}{optional}')
        return copy.deepcopy(dict(arch_zoo[key]))
    if not isinstance(arch, Mapping) or not set(essential) <= set(arch):
        raise ValueError(f'A custom arch for {owner} must be a dict with keys {essential}'
                         f'{optional}, got {arch!r}')
    known = set(essential) | set(defaults or {}) | {k for v in arch_zoo.values() for k in v}
    unknown = sorted(set(arch) - known)
    if unknown:
        raise ValueError(f'A custom arch for {owner} has keys it does not take: {unknown}; its '
                         f'keys are {essential}{optional}')
    # deep copies: a backbone must never mutate the zoo or the caller's config
    return copy.deepcopy({**(defaults or {}), **arch})
