"""Ahead-of-time compilation of every op's kernels for sm_80 and sm_90, without a GPU.

Each op's matrix below is exactly the launches its launchers issue for those cases (each op's
``spec.record`` records them). A compile must use no stack frame (no
register spills, no local memory) and fit the target's shared memory. The subsets run by
default; ``--run-slow`` compiles the full matrices. One op-specific register budget is checked
from the same compiles.
"""
import functools
from typing import Any, Dict, List, NamedTuple

import pytest

from mmeffattn.analysis.kernels import case, record
from op_checks import aot_compile, check_aot

pytest.importorskip('triton')

sema_case = functools.partial(case, 'sema_attention')
core_periphery_case = functools.partial(case, 'core_periphery_attention')
laplacian_case = functools.partial(case, 'laplacian_kernel')
newton_schulz_case = functools.partial(case, 'newton_schulz_pinv')
dynamic_dwconv_case = functools.partial(case, 'dynamic_dwconv')
dynamic_weight_case = functools.partial(case, 'dynamic_weight')


class Matrix(NamedTuple):
    """``subset`` compiles by default, ``full`` with ``--run-slow``; ``kernels`` must all be
    compiled by the subset."""
    subset: List[Dict[str, Any]]
    full: List[Dict[str, Any]]
    kernels: frozenset


# Only the tile class changes the compiled code: dtype, padded head dim BD, whether D == BD,
# one block per window or several, the block size, the mean added or returned (the forward
# writes partial sums either way; the backward reads the mean's gradient, fp32 or in v's
# dtype, and the delta pre-pass subtracts an added mean) or absent (plus Triton's alignment
# specialisation of pointers and strides). Window token counts 12, 30, 49
# and 144 hit every block class (16, 32, 64 tokens in one block; several blocks). The subset:
# the backbone's head dim 32 with window 7 in every dtype (the mean returned, as the backbone
# calls it) plus one case of each other kind of tile, in both mean modes.
_MEAN_MODES = (dict(with_mean=True), dict(with_mean=True, return_mean=True),
               dict(with_mean=False))
SEMA = Matrix(
    subset=[sema_case(32, 7, 14, 14, 'fp16', return_mean=True),
            sema_case(32, 7, 14, 14, 'bf16', return_mean=True),
            sema_case(32, 7, 14, 14, 'fp32', return_mean=True),
            sema_case(32, 7, 14, 14, 'bf16'),
            sema_case(128, 7, 14, 14, 'bf16', return_mean=True),
            sema_case(128, 7, 14, 14, 'fp32'), sema_case(40, 12, 24, 24, 'fp16', with_mean=False),
            sema_case(128, 12, 24, 24, 'bf16'),
            sema_case(128, 12, 24, 24, 'bf16', return_mean=True),
            sema_case(64, 12, 24, 24, 'fp32', return_mean=True),
            sema_case(72, 7, 3, 4, 'fp16'), sema_case(24, 7, 5, 6, 'fp32')],
    full=[sema_case(D, window, H, W, dtype, layout=layout, **mode)
          for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
          for dtype in ('fp16', 'bf16', 'fp32')
          for window, H, W in ((7, 3, 4), (7, 5, 6), (7, 14, 14), (12, 24, 24))
          for mode in _MEAN_MODES
          for layout in ('backbone', 'contiguous')],
    kernels=frozenset({'sema_fwd_window_kernel', 'sema_bwd_window_kernel', 'sema_fwd_kernel',
                       'sema_bwd_kernel', 'softmax_bwd_delta_kernel'}))

# The tile class: dtype, padded head dim BD and whether D == BD, the core block (next_pow2(C),
# 16 at least, capped at the long block), rope or not, and for the core rows' long loops
# whether they write the final tensors or fp32 partials (a split). C in {8, 20, 64} reaches
# every core block (16, 32, 64; fp32 caps at 32, so 64 cores are two blocks there). The
# subset: VECA-S and VECA-B (head dim 64) with 8 and 64 cores and per-sample tables in every
# dtype, plus a broadcast table, the split path and no rope.
CORE_PERIPHERY = Matrix(
    subset=[core_periphery_case(64, 8, 'fp16'), core_periphery_case(64, 64, 'fp16'),
            core_periphery_case(64, 64, 'bf16'), core_periphery_case(64, 8, 'bf16'),
            core_periphery_case(64, 8, 'fp32'), core_periphery_case(64, 64, 'fp32', 'shared'),
            core_periphery_case(64, 64, 'fp16', None, splits=2),
            core_periphery_case(64, 64, 'bf16', 'batch', splits=2)],
    full=[core_periphery_case(D, C, dtype, rope, splits=splits)
          for D in (16, 24, 32, 40, 64, 72, 128)
          for dtype in ('fp16', 'bf16', 'fp32')
          for C in (8, 20, 64)
          for rope in (None, 'batch', 'shared')
          for splits in (None, 2)],
    kernels=frozenset({'core_periphery_fwd_kernel', 'core_periphery_bwd_dq_kernel',
                       'core_periphery_bwd_dkdv_kernel', 'softmax_bwd_delta_kernel'}))

# The dtype, the D tiles (BD 8 / 16, or D < 8), and Triton's alignment specialisation of D and
# the strides (the token layout's strides are heads * D); N and M are runtime arguments. The
# subset: the token layout in fp16 with an odd D, a contiguous bf16 case at the model's sizes
# (49 landmarks), a tiny D.
LAPLACIAN = Matrix(
    subset=[laplacian_case(37, 13, 24, 'fp16', 'tokens'), laplacian_case(3136, 49, 64, 'bf16'),
            laplacian_case(37, 13, 5, 'fp32')],
    full=[laplacian_case(N, M, D, dtype, layout)
          for D in (5, 8, 24, 32, 40, 64)
          for dtype in ('fp16', 'bf16', 'fp32')
          for N, M in ((37, 13), (3136, 49))
          for layout in ('contiguous', 'tokens')],
    kernels=frozenset({'laplacian_fwd_kernel', 'laplacian_bwd_kernel'}))

# The kernels only see fp32 padded buffers: the padded size MP (16, 32: whole-matrix kernels;
# 64, 128, 256: multi-program kernels, 8 warps at 256), whether the forward keeps its iterates,
# and Triton's specialisation of M and iters (== 1, divisible by 16) and of the workspace
# strides. The subset: MP 16 (whole-matrix both ways), 64, 128 and 256 (multi-program).
NEWTON_SCHULZ = Matrix(
    subset=[newton_schulz_case(13), newton_schulz_case(40), newton_schulz_case(100),
            newton_schulz_case(200)],
    full=[newton_schulz_case(M, iters) for M in (1, 13, 16, 17, 32, 33, 49, 64, 100, 128, 200,
                                                 256)
          for iters in (1, 3)],
    kernels=frozenset({'newton_schulz_fwd_kernel', 'newton_schulz_bwd_kernel',
                       'newton_schulz_init_kernel', 'newton_schulz_step_kernel',
                       'newton_schulz_bwd_q_kernel', 'newton_schulz_bwd_step_kernel',
                       'newton_schulz_bwd_alpha_kernel'}))

# WeightFormer-T/S (C 192/384, K 3, token layout) fp32/bf16; odd channels, NCHW, K 5/7/9 (9: the
# largest the op sends to the kernels) and the variants without normalization, static kernel
# or bias.
DYNAMIC_DWCONV = Matrix(
    subset=[dynamic_dwconv_case(192, 14, 14, 3, 'fp32'),
            dynamic_dwconv_case(384, 64, 64, 3, 'bf16'),
            dynamic_dwconv_case(40, 13, 17, 5, 'fp16', layout='nchw'),
            dynamic_dwconv_case(72, 13, 17, 9, 'fp32', layout='nchw', normalize=False,
                                weight=False, bias=False),
            dynamic_dwconv_case(6, 7, 5, 7, 'bf16')],
    full=[dynamic_dwconv_case(C, 13, 17, K, dtype, layout, normalize, normalize, bias)
          for C in (6, 40, 192, 384)
          for K in (1, 3, 5, 7, 9)
          for dtype in ('fp32', 'fp16', 'bf16')
          for layout in ('tokens', 'nchw')
          for normalize in (True, False)
          for bias in (True, False)],
    kernels=frozenset({'dynamic_dwconv_fwd_kernel', 'dynamic_dwconv_bwd_kernel',
                       'dynamic_dwconv_bwd_reduce_kernel'}))

# WeightFormer-T/S/B fc1 (C_in 192 -> one 256-wide tile; 384 -> one 512-wide tile) at 224 px
# (M 49) and 1024 px (M 1024), fp32 (FMA dots) and bf16/fp16 (tensor cores); the sweep (C_in
# 1000, unaligned, and 1536); small unaligned widths as in the interpreted tests.
DYNAMIC_WEIGHT = Matrix(
    subset=[dynamic_weight_case(49, 192, 768, 'fp32'), dynamic_weight_case(49, 192, 768, 'bf16'),
            dynamic_weight_case(1024, 384, 1536, 'fp32'),
            dynamic_weight_case(1024, 384, 1536, 'bf16'),
            dynamic_weight_case(49, 1000, 40, 'fp32'),
            dynamic_weight_case(49, 1000, 40, 'bf16', weight=None),
            dynamic_weight_case(37, 40, 72, 'fp32'),
            dynamic_weight_case(37, 72, 40, 'fp16', weight=None),
            dynamic_weight_case(49, 300, 40, 'fp32')],
    full=[dynamic_weight_case(M, C_in, C_out, dtype, weight)
          for M in (49, 1024)
          for C_in, C_out in ((192, 768), (384, 1536), (768, 192), (40, 72), (200, 72),
                              (300, 40), (1000, 40), (1536, 384))
          for dtype in ('fp32', 'fp16', 'bf16')
          for weight in ('fp32', None)],
    kernels=frozenset({'dynamic_weight_fwd_kernel', 'dynamic_weight_bwd_dp_kernel',
                       'dynamic_weight_bmm_kernel'}))

MATRICES = dict(sema_attention=SEMA, core_periphery_attention=CORE_PERIPHERY,
                laplacian_kernel=LAPLACIAN, newton_schulz_pinv=NEWTON_SCHULZ,
                dynamic_dwconv=DYNAMIC_DWCONV, dynamic_weight=DYNAMIC_WEIGHT)
#: the core-periphery dk/dv kernel's register budget per thread: at most 128 lets at least
#: 4 warps x 4 CTAs share an SM's 64K registers, so its latency can be hidden; the fused
#: backward's kernels (dq plus a share of dk/dv, dk/dv plus a share of dq) have the same budget
DKDV_MAX_REGISTERS = 128
#: the launch roles held to :data:`DKDV_MAX_REGISTERS`: every dk/dv launch and the fused
#: patch-row one
BUDGETED_ROLES = ('bwd_dkdv_patches', 'bwd_dkdv_cores', 'bwd_keys', 'bwd_patches')


def test_every_op_has_a_matrix() -> None:
    from mmeffattn.ops._spec import SPECS
    assert set(MATRICES) == {s.name for s in SPECS}


@functools.lru_cache(maxsize=None)
def _subset_results(name: str) -> List[dict]:
    """The AOT subset of op ``name``, compiled once per session (several tests read it)."""
    return aot_compile(MATRICES[name].subset)


@pytest.mark.parametrize('op', list(MATRICES))
def test_aot_compile_subset(op: str) -> None:
    check_aot(_subset_results(op), MATRICES[op].kernels)


def test_dynamic_weight_subset_covers_both_code_paths() -> None:
    """The dynamic-weight subset compiles a one-tile and a swept (several ``i`` tiles)
    configuration."""
    tiles = {launch.config.constexprs['NUM_I_TILES'] > 1 for case in DYNAMIC_WEIGHT.subset
             for launch in record(case) if 'NUM_I_TILES' in launch.config.constexprs}
    assert tiles == {True, False}


def test_core_periphery_dkdv_registers() -> None:
    """The core-periphery dk/dv launches and the fused patch-row launch stay within
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
@pytest.mark.parametrize('op', list(MATRICES))
def test_aot_compile_full(op: str) -> None:
    check_aot(aot_compile(MATRICES[op].full), MATRICES[op].kernels)
