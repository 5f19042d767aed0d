"""Ahead-of-time compilation of every op's kernels for sm_80 and sm_90, without a GPU.

Each op's spec (``mmeffattn/ops/<op>/spec.py``) declares what to compile (``aot``): exactly
the launches its launchers issue. A compile must use no stack frame (no register spills, no
local memory) and fit the target's shared memory. The subsets run by default; ``--run-slow``
compiles the full matrices. A new op with an ``aot`` declaration is covered here (the
subset test is the "no spills anywhere" check of issue 14); one op-specific register budget
is checked from the same compiles.
"""
import functools
from typing import List

import pytest

from mmeffattn.ops._spec import all_specs, get_spec
from op_checks import aot_compile, check_aot

pytest.importorskip('triton')
SPECS = [s for s in all_specs() if s.aot is not None]
#: the core-periphery dk/dv kernel's register budget per thread (issue 14): at most 128 lets at
#: least 4 warps x 4 CTAs share an SM's 64K registers, so its latency can be hidden; the fused
#: backward's kernels (dq plus a share of dk/dv, dk/dv plus a share of dq) have the same budget
DKDV_MAX_REGISTERS = 128
#: the launch roles held to :data:`DKDV_MAX_REGISTERS`: every dk/dv launch and the fused
#: patch-row one
BUDGETED_ROLES = ('bwd_dkdv_patches', 'bwd_dkdv_cores', 'bwd_keys', 'bwd_patches')


@functools.lru_cache(maxsize=None)
def _subset_results(name: str) -> List[dict]:
    """The AOT subset of op ``name``, compiled once per session (several tests read it)."""
    return aot_compile(get_spec(name).aot.subset)


@pytest.mark.parametrize('spec', SPECS, ids=[s.name for s in SPECS])
def test_aot_compile_subset(spec) -> None:
    check_aot(_subset_results(spec.name), spec.aot.kernels)


def test_core_periphery_dkdv_registers() -> None:
    """The core-periphery dk/dv launches (two fp32 accumulators, the rope rotation of each
    query tile and the inverse rope in the epilogue; fused: plus the core queries' share of dq)
    and the fused patch-row launch (dq plus the patches' share of the cores' dk/dv) stay within
    :data:`DKDV_MAX_REGISTERS` on sm_80 and sm_90 without a spill, in every configuration of
    the op's AOT subset (the backbones' head dim, 8 and 64 cores, every dtype, per-sample /
    shared / no tables, table gradients, the split path, the fused and the deterministic
    backward)."""
    results = [r for r in _subset_results('core_periphery_attention')
               if r['role'] in BUDGETED_ROLES]
    assert {(r['role'], r['arch']) for r in results} == {
        (k, a) for k in BUDGETED_ROLES for a in (80, 90)}
    over = [(r['arch'], r['role'], r['case'], r['regs'], r['stack']) for r in results
            if r['regs'] > DKDV_MAX_REGISTERS or r['stack'] or r['local']]
    assert not over, over


@pytest.mark.slow
@pytest.mark.parametrize('spec', SPECS, ids=[s.name for s in SPECS])
def test_aot_compile_full(spec) -> None:
    check_aot(aot_compile(spec.aot.full), spec.aot.kernels)
