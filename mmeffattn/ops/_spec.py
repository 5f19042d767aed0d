"""Every op's facts, named one by one (read by the FLOP count, the GPU check and the tests);
a new op adds its ``<op>/spec.py`` here."""
from typing import List

from ._opspec import (DEFAULT_TOLERANCES, DTYPES, OpSpec, Tolerance, check_close, rms,
                      sdpa_macs)
from .core_periphery.spec import SPEC as CORE_PERIPHERY
from .dynamic_dwconv.spec import SPEC as DYNAMIC_DWCONV
from .dynamic_weight.spec import SPEC as DYNAMIC_WEIGHT
from .laplacian.spec import SPEC as LAPLACIAN
from .newton_schulz.spec import SPEC as NEWTON_SCHULZ
from .sema.spec import SPEC as SEMA

__all__ = ['SPECS', 'all_specs', 'get_spec', 'OpSpec', 'Tolerance', 'DEFAULT_TOLERANCES',
           'DTYPES', 'check_close', 'rms', 'sdpa_macs']

SPECS = (CORE_PERIPHERY, DYNAMIC_DWCONV, DYNAMIC_WEIGHT, LAPLACIAN, NEWTON_SCHULZ, SEMA)


def all_specs() -> List[OpSpec]:
    return list(SPECS)


def get_spec(name: str) -> OpSpec:
    """The spec of the public op ``name`` (ValueError listing the ops otherwise)."""
    specs = {s.name: s for s in SPECS}
    if name not in specs:
        raise ValueError(f'no op spec named {name!r}; ops with a spec: {sorted(specs)}')
    return specs[name]
