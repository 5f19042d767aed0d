"""Ahead-of-time compilation of every op's kernels for sm_80 and sm_90, without a GPU.

Each op's spec (``mmeffattn/ops/<op>/spec.py``) declares what to compile (``aot``): exactly
the launches its launchers issue. A compile must use no stack frame (no register spills, no
local memory) and fit the target's shared memory. The subsets run by default; ``--run-slow``
compiles the full matrices. A new op with an ``aot`` declaration is covered here.
"""
import pytest

from mmeffattn.ops._spec import all_specs
from op_checks import aot_compile, check_aot

pytest.importorskip('triton')
SPECS = [s for s in all_specs() if s.aot is not None]


@pytest.mark.parametrize('spec', SPECS, ids=[s.name for s in SPECS])
def test_aot_compile_subset(spec) -> None:
    check_aot(aot_compile(spec.aot.subset), spec.aot.kernels)


@pytest.mark.slow
@pytest.mark.parametrize('spec', SPECS, ids=[s.name for s in SPECS])
def test_aot_compile_full(spec) -> None:
    check_aot(aot_compile(spec.aot.full), spec.aot.kernels)
