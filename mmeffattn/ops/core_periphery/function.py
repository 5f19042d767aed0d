"""Launchers and the autograd Function of the Triton core-periphery attention kernels.

Importing this module needs Triton (``op.py`` guards it). The kernels run compiled on CUDA
tensors and interpreted on CPU tensors when Triton's interpreter is on.

One forward is two launches of ``core_periphery_fwd_kernel`` (patch rows over the C core keys;
core rows over all keys, optionally split over the keys); one backward is the ``delta``
pre-pass (``_common_kernels.softmax_bwd_delta``) and four launches:

* fused (the default): the patch rows' kernel computes their P and dS against the C cores once,
  writes the patches' dq and adds their share of the cores' dk/dv to a zeroed fp32 buffer with
  atomics; the patch keys' dk/dv (core queries only); the core rows' dq (all keys, optionally
  split); the core keys' dk/dv, looping over the C core queries and adding the buffer.
* deterministic (``torch.use_deterministic_algorithms``, and the tile classes without the fused
  kernel): no atomics; the patch rows' kernel writes dq only, and the core keys' dk/dv launch
  loops over all C + N queries (optionally split), recomputing the patch rows' P and dS.

Split long loops write fp32 partials reduced here with PyTorch (C rows only). With rope the dq
and dk/dv kernels map their gradients back through it in their epilogues and write q's dtype;
the tables' gradients (when asked for) are per-head fp32 partials those epilogues write, summed
here by one reduction.
"""
import math
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._launch import (KernelConfig, Launch, device_guard as _device_guard,  # noqa: F401
                       launch as _launch, next_pow2 as _next_pow2, record_launches,
                       unit_last_stride as _unit_last_stride)
from .._common import bh_strides as _strides, check_token_offsets as _check_int32_offsets
from .._common_kernels import delta_config, softmax_bwd_delta
from . import kernels

#: default ``tl.dot`` input precision for fp32: exact fp32 ('ieee'), not TF32.
DEFAULT_INPUT_PRECISION = 'ieee'
#: a split of a long loop gets at least this many blocks (fewer: the partials' reduction and
#: the repeated q tile load outweigh the extra parallelism)
MIN_BLOCKS_PER_SPLIT = 4


class Tiles(NamedTuple):
    core_block: int  # rows per block on the core side (C padded, at most ``long_block``)
    long_block: int  # rows per block on the token side (patch queries / keys)
    warps: int
    stages: int


#: the forward's ``(block, warps, stages)`` by (fp32 or not, padded head dim BD, D == BD,
#: rope): the first candidate in (64, 4, 2), (64, 8, 2), (64, 8, 1), (32, 4, 2), (32, 4, 1),
#: (32, 8, 1), (16, 4, 1) (fp32: (32, 4, 2), (32, 8, 2), (16, 4, 2), (16, 4, 1)) whose
#: attention kernels compiled for sm_80 and sm_90 (ptxas of Triton 3.8) without a register
#: spill, for fp16 and bf16, 8, 20 and 64 cores, per-sample and shared tables, with and without
#: a split: every specialisation of the spec's full AOT matrix (``tests/ops/test_aot.py``).
#: Rotating q/k tiles on load holds the tile and both tables at once, and a head dim below BD
#: adds masks: both need more warps or smaller tiles. The backward has its own table
#: (:data:`BWD_TILE_TABLE`).
TILE_TABLE = {
    # fp16 / bf16
    (False, 16, True, False): (64, 8, 2), (False, 16, True, True): (64, 4, 2),
    (False, 32, True, False): (64, 4, 2), (False, 32, True, True): (64, 8, 2),
    (False, 32, False, False): (32, 4, 2), (False, 32, False, True): (32, 4, 2),
    (False, 64, True, False): (64, 4, 2), (False, 64, True, True): (64, 8, 1),
    (False, 64, False, False): (32, 4, 2), (False, 64, False, True): (32, 4, 2),
    (False, 128, True, False): (32, 4, 2), (False, 128, True, True): (32, 8, 1),
    (False, 128, False, False): (32, 4, 1), (False, 128, False, True): (32, 8, 1),
    # fp32
    (True, 16, True, False): (32, 4, 2), (True, 16, True, True): (32, 4, 2),
    (True, 32, True, False): (32, 4, 2), (True, 32, True, True): (32, 8, 2),
    (True, 32, False, False): (32, 4, 2), (True, 32, False, True): (16, 4, 2),
    (True, 64, True, False): (32, 8, 2), (True, 64, True, True): (32, 8, 2),
    (True, 64, False, False): (16, 4, 2), (True, 64, False, True): (16, 4, 1),
    (True, 128, True, False): (16, 4, 1), (True, 128, True, True): (16, 4, 1),
    (True, 128, False, False): (16, 4, 2), (True, 128, False, True): (16, 8, 1),
}


def core_periphery_tiles(bd: int, even_d: bool, num_cores: int, dtype: torch.dtype,
                         rope: bool) -> Tiles:
    """Blocks, warps and pipelining stages for padded head dim ``bd`` (``even_d``: D == BD),
    C cores and rope or not.

    The core side is one block of ``next_pow2(C)`` rows (>= 16 for ``tl.dot``) up to the block
    size of the table (64 for fp16/bf16 at VECA's head dim 64: its largest budget of 64 cores is
    one block, so a patch tile sees all cores at once); more cores loop over several blocks.
    fp32 ``tl.dot`` with 'ieee' precision is an FMA loop holding its operands in registers, so
    fp32 uses 32-row or 16-row blocks; fp16/bf16 run on tensor cores.
    """
    block, warps, stages = TILE_TABLE[(dtype == torch.float32, bd, even_d, rope)]
    return Tiles(min(block, max(16, _next_pow2(num_cores))), block, warps, stages)


class BwdTiles(NamedTuple):
    row_block: int  # rows a backward program owns (its fp32 accumulators)
    loop_block: int  # rows per step of its loop (on sm_80 the mma B operands, whole per warp)
    warps: int
    stages: int
    maxnreg: Optional[int] = None  # register cap per thread (None: ptxas decides)
    fused_warps: int = 0  # warps of the fused patch-row kernel (0: not used, see below)


#: backward ``(row_block, loop_block, warps, stages, maxnreg, fused_warps)`` by (fp32 or not,
#: BD, D == BD, rope),
#: chosen so that every backward kernel compiles for sm_80 and sm_90 without a spill and the
#: dk/dv kernel (two fp32 accumulators) within 128 registers (two CTAs per SM): see
#: ``tests/ops/test_aot.py`` and ``tests/tools/test_kernel_report.py``. The loop block is the
#: smaller one: on sm_80 every warp holds a whole ``[loop_block, BD]`` operand of each product.
def _bwd_tiles(fp32: bool, bd: int, even: bool) -> Tuple[int, int, int, int]:
    """16-row loop steps; 32-row programs where the head is narrow and D == BD, 16 otherwise;
    8 warps for fp32 (its 'ieee' dots are FMA loops) except at BD = D = 128, where 8 warps
    spilled on sm_90 and 4 warps need 141-143 registers (over the dk/dv budget)."""
    row = 32 if (even and bd < 128) else 16
    if not fp32:
        return row, 16, 4, 1
    return row, 16, 4 if (bd == 128 and even) else 8, 1


def _fused_warps(fp32: bool, bd: int, even: bool, warps: int) -> int:
    """Warps of ``core_periphery_bwd_patches_kernel`` (16 x 16 tiles), 0 where the fused
    backward is not used. Its two extra products and the atomics hold more than the dq kernel:
    with the other backward kernels' warps it needed 144-168 registers at D = 40 (fp16) and
    126-202 at BD = 128 (sm_80 / sm_90); 8 warps bring those within 128. At BD = 128 with
    D < BD (D = 72) no choice did (fp16: 149-173 with 8 warps; fp32 with rope: a 24-byte stack
    at 8 warps, 232-244 registers at 4, 147-161 capped at 168), so those classes keep the
    separate kernels."""
    if bd == 128 and not even:
        return 0
    if bd == 128 or (bd == 64 and not even and not fp32):
        return 8
    return warps


#: (fp32, BD, D == BD, rope) whose 8-warp backward kernels ptxas left at 64 or 80 registers
#: (the occupancy steps of 256 threads: 4 or 3 CTAs per SM) with an 8-byte stack frame, i.e.
#: two values live across the loop spilled (STL before it, LDL after it): D = 24 and 32 with
#: rope, D = 72 without. An explicit cap of :data:`BWD_MAXNREG` lets ptxas keep them in
#: registers (the same cure as ``dynamic_dwconv``'s backward): 79-128 registers, no stack. Any
#: cap from 81 to 128 gives 8 warps the same occupancy (2 CTAs per SM), so the widest is taken.
#: Elsewhere ptxas decides (4 warps instead moved the frames to other kernels and took D = 72 to
#: 184 registers).
BWD_CAPPED = frozenset({(True, 32, False, True), (True, 32, True, True),
                        (True, 128, False, False)})
#: the backward's register cap where :data:`BWD_CAPPED` asks for one: the dk/dv budget
BWD_MAXNREG = 128

BWD_TILE_TABLE = {
    (fp32, bd, even, rope): (*_bwd_tiles(fp32, bd, even),
                             BWD_MAXNREG if (fp32, bd, even, rope) in BWD_CAPPED else None,
                             _fused_warps(fp32, bd, even, _bwd_tiles(fp32, bd, even)[2]))
    for fp32 in (False, True) for bd in (16, 32, 64, 128)
    for even in (False, True) for rope in (False, True)}


def core_periphery_bwd_tiles(bd: int, even_d: bool, dtype: torch.dtype, rope: bool) -> BwdTiles:
    """The backward kernels' tiles for padded head dim ``bd`` (:data:`BWD_TILE_TABLE`)."""
    return BwdTiles(*BWD_TILE_TABLE[(dtype == torch.float32, bd, even_d, rope)])


def padded_head_dim(head_dim: int) -> int:
    """BD: the head dim padded to a power of two, at least 16 (a ``tl.dot`` operand)."""
    return max(16, _next_pow2(head_dim))


def core_periphery_kernel_configs(head_dim: int, num_cores: int, dtype: torch.dtype, rope: bool,
                      input_precision: str = DEFAULT_INPUT_PRECISION,
                      rope_grad: bool = False, fused: bool = True) -> Dict[str, KernelConfig]:
    """The configurations the launchers use, by role: ``fwd_patches``, ``fwd_cores``,
    ``bwd_preprocess``, ``bwd_patches`` (fused) or ``bwd_dq_patches`` (not), ``bwd_dq_cores``,
    ``bwd_dkdv_patches``, ``bwd_dkdv_cores``. ``*_patches`` have the patch tokens on the
    program's rows, ``*_cores`` the core tokens (and the long loop). ``rope_grad``: the backward
    kernels also write the rope tables' gradients (``ROPE_GRAD``). ``fused``: the patch rows'
    dq kernel also sums their share of the cores' dk/dv (``bwd_patches``, fp32 atomics), and
    the cores' dk/dv kernel adds those sums (``ACC_INIT``) and loops over the core
    queries only (:func:`use_fused_backward`)."""
    bd = padded_head_dim(head_dim)
    t = core_periphery_tiles(bd, head_dim == bd, num_cores, dtype, rope)
    common = dict(BD=bd, EVEN_D=head_dim == bd, ROPE=rope, INPUT_PRECISION=input_precision)
    grad = dict(ROPE_GRAD=rope and rope_grad)

    bt = core_periphery_bwd_tiles(bd, head_dim == bd, dtype, rope)
    fused = fused and bt.fused_warps > 0
    core = max(16, _next_pow2(num_cores))  # the core side, padded

    def cfg(kernel, block_m: int, block_n: int) -> KernelConfig:
        return KernelConfig(kernel, dict(common, BLOCK_M=block_m, BLOCK_N=block_n), t.warps,
                            t.stages)

    def bwd(kernel, block_m: int, block_n: int, **extra) -> KernelConfig:
        return KernelConfig(kernel, dict(common, **grad, **extra, BLOCK_M=block_m,
                                         BLOCK_N=block_n), bt.warps, bt.stages, bt.maxnreg)

    dq, dkdv = kernels.core_periphery_bwd_dq_kernel, kernels.core_periphery_bwd_dkdv_kernel
    row, loop = bt.row_block, bt.loop_block
    cfgs = {
        # BLOCK_M: query rows, BLOCK_N: key rows
        'fwd_patches': cfg(kernels.core_periphery_fwd_kernel, t.long_block, t.core_block),
        'fwd_cores': cfg(kernels.core_periphery_fwd_kernel, t.core_block, t.long_block),
        'bwd_preprocess': delta_config(head_dim, with_mean=False),
        # programs own the first block's rows and loop over the second's
        'bwd_dq_cores': bwd(dq, min(core, row), loop),
        'bwd_dkdv_patches': bwd(dkdv, min(core, loop), row, ACC_INIT=False),
        'bwd_dkdv_cores': bwd(dkdv, loop, min(core, row), ACC_INIT=fused)}
    if fused and bt.warps == 8 and bt.maxnreg is None:
        # the sums added after the loop: ptxas kept fp32 D = 64 with rope at 64 registers
        # (4 CTAs of 8 warps) with a 16-byte stack on sm_90; capped like BWD_CAPPED
        cfgs['bwd_dkdv_cores'] = KernelConfig(dkdv, cfgs['bwd_dkdv_cores'].constexprs,
                                              bt.warps, bt.stages, BWD_MAXNREG)
    if fused:
        # loop-block rows: with the dq kernel's 32 rows the extra products and atomics took
        # fp16 / bf16 to 162 registers on sm_80 (and a cap of 128 spilled on sm_90)
        cfgs['bwd_patches'] = KernelConfig(
            kernels.core_periphery_bwd_patches_kernel,
            dict(common, **grad, BLOCK_M=loop, BLOCK_N=min(core, loop)), bt.fused_warps,
            bt.stages, bt.maxnreg)
    else:
        cfgs['bwd_dq_patches'] = bwd(dq, row, min(core, loop))
    return cfgs


def use_fused_backward() -> bool:
    """The fused patch-row backward (fp32 atomics, run-to-run differences in the last bits of
    the cores' dk/dv) unless ``torch.use_deterministic_algorithms`` is on."""
    return not torch.are_deterministic_algorithms_enabled()


def num_splits(n_programs: int, n_loop_blocks: int, device: torch.device,
               splits: Optional[int] = None) -> Tuple[int, int]:
    """``(n_splits, blocks_per_split)`` for a long loop of ``n_loop_blocks`` blocks run by
    ``n_programs`` programs before splitting.

    The core rows are few (C <= 64 is one block per batch*head), so with a small batch the
    launch would occupy a handful of SMs while each program walks all C + N keys. Splitting the
    loop over programs (flash-decoding) brings the launch to about two programs per SM, with at
    least ``MIN_BLOCKS_PER_SPLIT`` blocks per split. ``splits`` forces a count (tests); on the
    CPU (interpreter) the default is no split.
    """
    if splits is None:
        if device.type != 'cuda':
            splits = 1
        else:
            target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
            splits = (1 if n_programs >= target else
                      min(-(-target // n_programs), n_loop_blocks // MIN_BLOCKS_PER_SPLIT))
    splits = max(1, min(splits, n_loop_blocks))
    per_split = -(-n_loop_blocks // splits)
    return -(-n_loop_blocks // per_split), per_split  # every split gets at least one block


def _table_strides(t: torch.Tensor) -> Tuple[int, int]:
    """``(stride_rb, stride_rn)`` of a ``[B or 1, L, D]`` rope table; a ``[1, L, D]`` table
    broadcasts over the batch with a zero batch stride."""
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def _pair_aligned(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """x with every row of its last dim starting at an even element (even strides, pair-aligned
    start): the rope kernels declare it (``kernels._rows``) so that a channel pair is one load;
    a copy only for unusual views (a contiguous tensor with an even D qualifies)."""
    if x is None:
        return None
    # (the storage offset, not data_ptr: allocations are aligned, and fake tensors have none)
    if all(st % 2 == 0 for st in x.stride()[:-1]) and x.storage_offset() % 2 == 0:
        return x
    return x.contiguous()


def _pair_aligned_inputs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """:func:`_pair_aligned` q, k and tables (the tables keep one set of strides)."""
    q, k, cos, sin = (_pair_aligned(x) for x in (q, k, cos, sin))
    if _table_strides(cos) != _table_strides(sin):
        cos, sin = cos.contiguous(), sin.contiguous()
    return q, k, cos, sin


def _rope_args(q: torch.Tensor, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor]
               ) -> Tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(cos, sin, stride_rb, stride_rn)`` kernel arguments (q stands in when rope is off)."""
    if cos is None:
        return q, q, 0, 0
    strides = _table_strides(cos)
    assert strides == _table_strides(sin), 'cos and sin share the kernels\' stride arguments'
    return (cos, sin, *strides)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def core_periphery_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], num_cores: int,
                       scale: float, input_precision: str = DEFAULT_INPUT_PRECISION,
                       splits: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher.

    Args:
        q, k, v: ``[B, heads, C + N, D]``, unit stride on D.
        cos, sin: None or ``[B or 1, C + N, D]`` in q's dtype, unit stride on D.
        splits: force the number of splits of the core rows' key loop (None: :func:`num_splits`).
    Returns:
        o ``[B, heads, C + N, D]`` (contiguous, q's dtype); lse ``[B*heads, C + N]`` fp32
        log2-sum-exp.
    """
    B, nh, L, D = q.shape
    C, N, BH = num_cores, L - num_cores, B * q.shape[1]
    cfgs = core_periphery_kernel_configs(D, C, q.dtype, cos is not None, input_precision)
    if cos is not None:
        q, k, cos, sin = _pair_aligned_inputs(q, k, cos, sin)
    o = torch.empty((B, nh, L, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((BH, L), dtype=torch.float32, device=q.device)
    _check_int32_offsets(q, k, v, o)
    cos, sin, stride_rb, stride_rn = _rope_args(q, cos, sin)
    inputs = (q, k, v, cos, sin)
    strides = (*_strides(q), *_strides(k), *_strides(v), stride_rb, stride_rn)
    with _device_guard(q):
        # patch rows [C, L) over the core keys [0, C): a short loop, written in place
        cfg = cfgs['fwd_patches']
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-N // bm)
        _launch('fwd_patches', cfg, (n_blocks * BH,), *inputs, o, lse, *strides,
                0, L * D, D, 0, L, nh, C, N, C, n_blocks, 1, -(-C // bn), C, scale, D)
        # core rows [0, C) over all keys [0, L)
        cfg = cfgs['fwd_cores']
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-C // bm)
        n_splits, per_split = num_splits(n_blocks * BH, -(-L // bn), q.device, splits)
        grid = (n_blocks * n_splits * BH,)
        sizes = (nh, 0, C, L, n_blocks, n_splits, per_split, 0, scale, D)
        if n_splits == 1:
            _launch('fwd_cores', cfg, grid, *inputs, o, lse, *strides, 0, L * D, D, 0, L, *sizes)
        else:
            o_part = torch.empty((n_splits, BH, C, D), dtype=torch.float32, device=q.device)
            lse_part = torch.empty((n_splits, BH, C), dtype=torch.float32, device=q.device)
            _launch('fwd_cores', cfg, grid, *inputs, o_part, lse_part, *strides,
                    BH * C * D, C * D, D, BH * C, C, *sizes)
            # merge the splits' softmaxes: weight each normalised part by its share of the mass
            lse_c = torch.logsumexp(lse_part * math.log(2), dim=0) / math.log(2)  # [BH, C]
            weight = torch.exp2(lse_part - lse_c)  # [S, BH, C]
            o.view(BH, L, D)[:, :C] = torch.einsum('sbc,sbcd->bcd', weight, o_part).to(q.dtype)
            lse[:, :C] = lse_c
    return o, lse


def core_periphery_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], o: torch.Tensor,
                       lse: torch.Tensor, num_cores: int, scale: float,
                       input_precision: str = DEFAULT_INPUT_PRECISION,
                       splits: Optional[int] = None, rope_grad: bool = False,
                       fused: Optional[bool] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                  Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Backward launcher: ``(dq, dk, dv, dcos, dsin)``.

    ``fused`` (None: :func:`use_fused_backward`): the patch rows' P and dS, computed once, give
    both the patches' dq and their share of the cores' dk/dv (fp32 atomics into a zeroed
    ``[2, B*heads, C, D]`` buffer), and the cores' dk/dv launch then loops over the C core
    queries only (no split); otherwise (deterministic) the cores' dk/dv launch recomputes the
    patch rows' P and dS over all C + N queries.

    dq, dk, dv are ``[B, heads, C + N, D]`` contiguous in q's dtype (with rope: the gradients of
    the unrotated q and k; the kernels map them back). dcos, dsin are the gradients of the rope
    tables (``[B or 1, C + N, D]``, cos's dtype) when rope is on and ``rope_grad``, else None.
    ``o`` and ``lse`` are the forward's outputs.
    """
    B, nh, L, D = q.shape
    C, N, BH = num_cores, L - num_cores, B * q.shape[1]
    rope = cos is not None
    rope_grad = rope and rope_grad
    fused = use_fused_backward() if fused is None else fused
    cfgs = core_periphery_kernel_configs(D, C, q.dtype, rope, input_precision, rope_grad, fused)
    fused = 'bwd_patches' in cfgs  # not in every tile class (:func:`_fused_warps`)
    do = _unit_last_stride(do)
    if rope:
        q, k, cos, sin = _pair_aligned_inputs(q, k, cos, sin)
    dq = torch.empty((B, nh, L, D), dtype=q.dtype, device=q.device)
    dk, dv = torch.empty_like(dq), torch.empty_like(dq)
    # per-(batch, head) table gradients: [source (q, k), table (cos, sin), B*heads, L, D]
    dtab = (torch.empty((2, 2, BH, L, D), dtype=torch.float32, device=q.device) if rope_grad
            else dq.new_empty(0))
    _check_int32_offsets(q, k, v, do, dq)
    tables = cos
    cos, sin, stride_rb, stride_rn = _rope_args(q, cos, sin)
    inputs = (q, k, v, cos, sin, do, lse)
    strides = (*_strides(q), *_strides(k), *_strides(v), stride_rb, stride_rn, *_strides(do))
    out_strides = (0, L * D, D)
    # (split, batch*head, cos / sin plane, row) strides of a table-gradient plane
    tab_strides = (0, L * D, BH * L * D, D) if rope_grad else (0, 0, 0, 0)
    # the cores' dk (of the rotated k, unscaled) and dv summed over the patch rows (fused)
    acc = (torch.zeros((2, BH, C, D), dtype=torch.float32, device=q.device) if fused
           else dq.new_empty(0))
    acc_strides = (BH * C * D, C * D, D) if fused else (0, 0, 0)

    def tab(i: int) -> torch.Tensor:
        return dtab[i] if rope_grad else dtab

    def partials(n_splits: int, n: int) -> Tuple[torch.Tensor, ...]:
        """fp32 ``[n_splits, BH, C, D]`` partial outputs and the table partials
        ``[n_splits, 2, BH, C, D]``, and their strides."""
        part = torch.empty((n, n_splits, BH, C, D), dtype=torch.float32, device=q.device)
        t_part = (torch.empty((n_splits, 2, BH, C, D), dtype=torch.float32, device=q.device)
                  if rope_grad else dtab)
        t_strides = (2 * BH * C * D, C * D, BH * C * D, D) if rope_grad else tab_strides
        return part, t_part, (BH * C * D, C * D, D), t_strides

    with _device_guard(q):
        delta = softmax_bwd_delta(cfgs['bwd_preprocess'], o, do)

        # dq of the patch rows [C, L): keys [0, C) (fused: and their share of the cores' dk/dv)
        role = 'bwd_patches' if fused else 'bwd_dq_patches'
        cfg = cfgs[role]
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-N // bm)
        extra, extra_strides = ((acc,), acc_strides) if fused else ((), ())
        _launch(role, cfg, (n_blocks * BH,), *inputs, delta, dq, tab(0), *extra, *strides,
                *out_strides, *tab_strides, *extra_strides, nh, C, N, C, n_blocks, 1, -(-C // bn),
                C, L, scale, D)
        # dk, dv of the patch keys [C, L): only the core queries [0, C) attend them
        cfg = cfgs['bwd_dkdv_patches']
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-N // bn)
        _launch('bwd_dkdv_patches', cfg, (n_blocks * BH,), *inputs, delta, dk, dv, tab(1), acc,
                *strides, *out_strides, *tab_strides, 0, 0, 0, nh, C, N, C, n_blocks, 1,
                -(-C // bm), C, L, scale, D)

        # dq of the core rows [0, C): all keys [0, L), optionally split
        cfg = cfgs['bwd_dq_cores']
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-C // bm)
        n_splits, per_split = num_splits(n_blocks * BH, -(-L // bn), q.device, splits)
        grid = (n_blocks * n_splits * BH,)
        sizes = (nh, 0, C, L, n_blocks, n_splits, per_split, 0, L, scale, D)
        if n_splits == 1:
            _launch('bwd_dq_cores', cfg, grid, *inputs, delta, dq, tab(0), *strides,
                    *out_strides, *tab_strides, *sizes)
        else:
            part, t_part, p_strides, t_strides = partials(n_splits, 1)
            _launch('bwd_dq_cores', cfg, grid, *inputs, delta, part[0], t_part, *strides,
                    *p_strides, *t_strides, *sizes)
            dq.view(BH, L, D)[:, :C] = part[0].sum(0)
            if rope_grad:
                dtab[0, :, :, :C] = t_part.sum(0)

        # dk, dv of the core keys [0, C): every query [0, L) attends them, optionally split;
        # fused: the patch rows' share is in acc, the core queries [0, C) are left (one split)
        cfg = cfgs['bwd_dkdv_cores']
        bm, bn = cfg.constexprs['BLOCK_M'], cfg.constexprs['BLOCK_N']
        n_blocks = -(-C // bn)
        n_q = C if fused else L
        n_splits, per_split = ((1, -(-C // bm)) if fused else
                               num_splits(n_blocks * BH, -(-L // bm), q.device, splits))
        grid = (n_blocks * n_splits * BH,)
        sizes = (nh, 0, C, n_q, n_blocks, n_splits, per_split, 0, L, scale, D)
        if n_splits == 1:
            _launch('bwd_dkdv_cores', cfg, grid, *inputs, delta, dk, dv, tab(1), acc, *strides,
                    *out_strides, *tab_strides, *acc_strides, *sizes)
        else:
            part, t_part, p_strides, t_strides = partials(n_splits, 2)
            _launch('bwd_dkdv_cores', cfg, grid, *inputs, delta, part[0], part[1], t_part, acc,
                    *strides, *p_strides, *t_strides, *acc_strides, *sizes)
            dk.view(BH, L, D)[:, :C] = part[0].sum(0)
            dv.view(BH, L, D)[:, :C] = part[1].sum(0)
            if rope_grad:
                dtab[1, :, :, :C] = t_part.sum(0)
    dcos = dsin = None
    if rope_grad:  # one reduction per table: over the source (q, k), the heads (and a shared
        # table's batch); two separate results, not views of one (custom operators need that)
        dims = (0, 1, 2) if tables.shape[0] == 1 else (0, 2)
        dcos, dsin = (dtab[:, i].view(2, B, nh, L, D).sum(dims).view(-1, L, D).to(tables.dtype)
                      for i in range(2))
    return dq, dk, dv, dcos, dsin


class CorePeripheryAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of the Triton kernels (first-order gradients for q, k, v, cos, sin)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], num_cores: int,
                scale: float, input_precision: str, splits: Optional[int]) -> torch.Tensor:
        q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
        if cos is not None:
            cos, sin = _unit_last_stride(cos), _unit_last_stride(sin)
            if _table_strides(cos) != _table_strides(sin):  # the kernels take one set
                cos, sin = cos.contiguous(), sin.contiguous()
        o, lse = core_periphery_fwd(q, k, v, cos, sin, num_cores, scale, input_precision, splits)
        if any(ctx.needs_input_grad[:5]):
            ctx.save_for_backward(q, k, v, cos, sin, o, lse)
        ctx.num_cores, ctx.scale, ctx.input_precision, ctx.splits = (num_cores, scale,
                                                                     input_precision, splits)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: torch.Tensor):
        q, k, v, cos, sin, o, lse = ctx.saved_tensors
        needs = ctx.needs_input_grad
        dq, dk, dv, dcos, dsin = core_periphery_bwd(
            do, q, k, v, cos, sin, o, lse, ctx.num_cores, ctx.scale, ctx.input_precision,
            ctx.splits, rope_grad=needs[3] or needs[4])
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                dcos if needs[3] else None, dsin if needs[4] else None,
                None, None, None, None)


def core_periphery_attention_triton(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int, *,
        rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, scale: Optional[float] = None,
        input_precision: str = DEFAULT_INPUT_PRECISION,
        splits: Optional[int] = None) -> torch.Tensor:
    """Core-periphery attention with the Triton kernels, no input validation (see
    ``op.core_periphery_attention``).

    Args:
        q, k, v: ``[B, heads, C + N, D]``.
        rope: None or ``(cos, sin)``, each ``[B or 1, C + N, D]``; cast to q's dtype here, with
            autograd, so their gradients come back in their own dtype.
        splits: force the number of splits of the core rows' long loops (tests).
    Returns:
        ``[B, heads, C + N, D]`` contiguous.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    cos = sin = None
    if rope is not None:
        cos, sin = rope[0].to(q.dtype), rope[1].to(q.dtype)
    return CorePeripheryAttentionFunction.apply(q, k, v, cos, sin, num_cores, scale,
                                                input_precision, splits)


#: the launchers' former names (``cp_*``), kept as aliases
cp_fwd, cp_bwd = core_periphery_fwd, core_periphery_bwd
cp_tiles, cp_kernel_configs = core_periphery_tiles, core_periphery_kernel_configs
