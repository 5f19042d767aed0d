"""Launchers of the Triton core-periphery attention kernels (their autograd is registered
with the custom operators in ``library.py``).

Importing this module needs Triton (``op.py`` guards it). The kernels run compiled on CUDA
tensors and interpreted on CPU tensors when Triton's interpreter is on.

One forward is two launches of ``core_periphery_fwd_kernel`` (patch rows over the C core keys;
core rows over all keys, optionally split over the keys); one backward is the ``delta``
pre-pass (``_common_kernels.softmax_bwd_delta``) and then:

* fused (the default), three launches that compute every (query, key) pair's P and dS once:
  the patch rows' dq kernel (``KV_ATOMIC``) meets the C core keys, writes the patches' dq and
  adds their share of the cores' dk/dv to a zeroed fp32 buffer with atomics; the dk/dv kernel
  over all C + N keys (``ACC_INIT``, ``Q_ATOMIC``) meets the C core queries, writes every dk/dv
  (the core keys' plus the buffer's sums) and adds the cores' dq to the buffer's third plane
  with atomics; a dq launch over the C core rows (``ACC_INIT``, no key loop) maps that through
  the rope.
* deterministic (``torch.use_deterministic_algorithms``, and the tile classes without the fused
  kernels): four launches, no atomics: dq and dk/dv of the patch rows, dq and dk/dv of the core
  rows (all C + N keys and queries, optionally split), recomputing P and dS for each.

Split long loops write fp32 partials reduced here with PyTorch (C rows only). With rope the dq
and dk/dv kernels map their gradients back through it in their epilogues and write q's dtype;
the tables' gradients (when asked for) are per-head fp32 partials those epilogues write, summed
here by one reduction.
"""
import math
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from .._launch import (KernelConfig, Launch, device_guard as _device_guard,  # noqa: F401
                       launch as _launch, next_pow2 as _next_pow2, record_launches,
                       unit_last_stride as _unit_last_stride)
from .._common import autocast_off, bh_strides as _strides
from .._common import check_token_offsets as _check_int32_offsets
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
    fused_warps: int = 0  # warps of the fused backward's kernels (0: not used, see below)


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
    """Warps of the fused backward's kernels (the dq kernel with ``KV_ATOMIC`` on 16 x 16
    tiles, the dk/dv kernel with ``Q_ATOMIC``), 0 where the fused backward is not used. The
    patch rows' two extra products and the atomics hold more than the plain dq kernel:
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
    ``bwd_preprocess``, then fused (:func:`use_fused_backward`) ``bwd_patches`` (the patch rows'
    dq plus their share of the cores' dk/dv, ``KV_ATOMIC``), ``bwd_keys`` (every key's dk/dv
    from the core queries plus those sums, and the cores' dq, ``ACC_INIT`` + ``Q_ATOMIC``) and
    ``bwd_dq_cores`` (the cores' dq sums through the rope, ``ACC_INIT``), or deterministic
    ``bwd_dq_patches``, ``bwd_dkdv_patches``, ``bwd_dq_cores``, ``bwd_dkdv_cores``.
    ``*_patches`` have the patch tokens on the program's rows, ``*_cores`` the core tokens (and
    the long loop). ``rope_grad``: the backward kernels also write the rope tables' gradients
    (``ROPE_GRAD``)."""
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

    def bwd(kernel, block_m: int, block_n: int, warps: int = bt.warps,
            maxnreg: Optional[int] = bt.maxnreg, **flags) -> KernelConfig:
        return KernelConfig(kernel, dict(common, **grad, **flags, BLOCK_M=block_m,
                                         BLOCK_N=block_n), warps, bt.stages, maxnreg)

    dq, dkdv = kernels.core_periphery_bwd_dq_kernel, kernels.core_periphery_bwd_dkdv_kernel
    no_acc = dict(ACC_INIT=False)
    row, loop = bt.row_block, bt.loop_block
    cfgs = {
        # BLOCK_M: query rows, BLOCK_N: key rows
        'fwd_patches': cfg(kernels.core_periphery_fwd_kernel, t.long_block, t.core_block),
        'fwd_cores': cfg(kernels.core_periphery_fwd_kernel, t.core_block, t.long_block),
        'bwd_preprocess': delta_config(head_dim, with_mean=False)}
    # programs own the first block's rows and loop over the second's
    if fused:
        cfgs.update({
            # loop-block rows: with the dq kernel's 32 rows the extra products and atomics took
            # fp16 / bf16 to 162 registers on sm_80 (and a cap of 128 spilled on sm_90)
            'bwd_patches': bwd(dq, loop, min(core, loop), bt.fused_warps, KV_ATOMIC=True,
                               **no_acc),
            # the mirror of bwd_patches (16 x 16 tiles, its warps), capped at the dk/dv budget:
            # 32 key rows needed 156-159 registers at D = 64 (fp16 / bf16, rope, 4 warps; 8
            # warps and fp32 at D = 16 spilled 8-16 bytes under the cap)
            'bwd_keys': bwd(dkdv, min(core, loop), loop, bt.fused_warps, BWD_MAXNREG,
                            ACC_INIT=True, Q_ATOMIC=True),
            # 16-row blocks: 32 rows spilled 8 bytes (fp32, D = 64, rope, sm_90)
            'bwd_dq_cores': bwd(dq, min(core, loop), loop, KV_ATOMIC=False, ACC_INIT=True)})
    else:
        cfgs.update({
            'bwd_dq_patches': bwd(dq, row, min(core, loop), KV_ATOMIC=False, **no_acc),
            'bwd_dkdv_patches': bwd(dkdv, min(core, loop), row, Q_ATOMIC=False, **no_acc),
            'bwd_dq_cores': bwd(dq, min(core, row), loop, KV_ATOMIC=False, **no_acc),
            'bwd_dkdv_cores': bwd(dkdv, loop, min(core, row), Q_ATOMIC=False, **no_acc)})
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
            # (in fp32, as the kernels, also under autocast, which would run einsum in half)
            with autocast_off(q.device.type):
                lse_c = torch.logsumexp(lse_part * math.log(2), dim=0) / math.log(2)  # [BH, C]
                weight = torch.exp2(lse_part - lse_c)  # [S, BH, C]
                o.view(BH, L, D)[:, :C] = torch.einsum('sbc,sbcd->bcd', weight,
                                                       o_part).to(q.dtype)
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

    ``fused`` (None: :func:`use_fused_backward`): every (query, key) pair's P and dS are
    computed once; the launches that meet a pair from the other side add its share of the
    gradients with fp32 atomics to a zeroed ``[3, B*heads, C, D]`` buffer (the cores' dk, dv
    from the patch rows; the cores' dq from all keys). Otherwise (deterministic) the dq and the
    dk/dv launches each recompute P and dS, and the core rows' long loops may be split.

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
    # fused: the cores' dk (of the rotated k, unscaled), dv and dq (of the rotated q, unscaled)
    # summed by the launches that meet them from the other side
    acc = (torch.zeros((3, BH, C, D), dtype=torch.float32, device=q.device) if fused
           else dq.new_empty(0))
    acc_strides = (BH * C * D, C * D, D) if fused else (0, 0, 0)

    def tab(i: int) -> torch.Tensor:
        return dtab[i] if rope_grad else dtab

    def blocks(role: str) -> Tuple[int, int]:
        """``(own, loop)``: the block sizes of a launch's own rows and of its loop."""
        c = cfgs[role].constexprs
        is_dq = cfgs[role].kernel is kernels.core_periphery_bwd_dq_kernel
        return (c['BLOCK_M'], c['BLOCK_N']) if is_dq else (c['BLOCK_N'], c['BLOCK_M'])

    def launch(role: str, grads: Tuple[torch.Tensor, ...], table: torch.Tensor,
               acc_ptr: torch.Tensor, start: int, n_rows: int, n_loop: int,
               n_splits: int = 1, per_split: Optional[int] = None,
               g_strides: tuple = out_strides, t_strides: tuple = tab_strides) -> None:
        """One backward launch: programs own rows ``[start, start + n_rows)`` (dq: queries,
        dk/dv: keys) and loop over rows ``[0, n_loop)`` of the other side, writing ``grads``
        (dq, or dk and dv) and ``table`` at rows from ``start``."""
        own, loop = blocks(role)
        n_blocks = -(-n_rows // own)
        per_split = -(-n_loop // loop) if per_split is None else per_split
        _launch(role, cfgs[role], (n_blocks * n_splits * BH,), *inputs, delta, *grads, table,
                acc_ptr, *strides, *g_strides, *t_strides, *acc_strides, nh, start, n_rows,
                n_loop, n_blocks, n_splits, per_split, start, L, scale, D)

    def core_launch(role: str, grads: Tuple[torch.Tensor, ...], table: int) -> None:
        """The core rows ``[0, C)`` against all L rows of the other side, the loop split as
        :func:`num_splits` says: then fp32 partials, summed here into ``grads``' core rows."""
        own, loop = blocks(role)
        n_splits, per_split = num_splits(-(-C // own) * BH, -(-L // loop), q.device, splits)
        if n_splits == 1:
            launch(role, grads, tab(table), acc, 0, C, L)
            return
        part = torch.empty((len(grads), n_splits, BH, C, D), dtype=torch.float32,
                           device=q.device)
        t_part = (torch.empty((n_splits, 2, BH, C, D), dtype=torch.float32, device=q.device)
                  if rope_grad else dtab)
        launch(role, tuple(part), t_part, acc, 0, C, L, n_splits, per_split,
               (BH * C * D, C * D, D),
               (2 * BH * C * D, C * D, BH * C * D, D) if rope_grad else tab_strides)
        for grad, p in zip(grads, part):
            grad.view(BH, L, D)[:, :C] = p.sum(0)
        if rope_grad:
            dtab[table, :, :, :C] = t_part.sum(0)

    with _device_guard(q):
        delta = softmax_bwd_delta(cfgs['bwd_preprocess'], o, do)
        if fused:
            # the patch rows [C, L) against the core keys: their dq, the cores' dk/dv share
            launch('bwd_patches', (dq,), tab(0), acc, C, N, C)
            # every key [0, L) against the core queries: all dk/dv, the cores' dq share
            launch('bwd_keys', (dk, dv), tab(1), acc, 0, L, C)
            # the core rows' dq: the sums through the rope (no key loop)
            launch('bwd_dq_cores', (dq,), tab(0), acc[2], 0, C, 0)
        else:
            # the patch rows [C, L) over the core keys; the patch keys [C, L) from the core
            # queries, the only queries that attend them
            launch('bwd_dq_patches', (dq,), tab(0), acc, C, N, C)
            launch('bwd_dkdv_patches', (dk, dv), tab(1), acc, C, N, C)
            # the core rows [0, C) over all keys; the core keys from all queries
            core_launch('bwd_dq_cores', (dq,), 0)
            core_launch('bwd_dkdv_cores', (dk, dv), 1)
    dcos = dsin = None
    if rope_grad:  # one reduction per table: over the source (q, k), the heads (and a shared
        # table's batch); two separate results, not views of one (custom operators need that)
        # nor of a reduction's result (a view cannot be modified in place under autograd):
        # the kept unit dim (table i's plane) is a shared table's leading 1
        dims = (0, 2, 3) if tables.shape[0] == 1 else (0, 1, 3)
        dcos, dsin = (dtab[:, i:i + 1].view(2, 1, B, nh, L, D).sum(dims).to(tables.dtype)
                      for i in range(2))
    return dq, dk, dv, dcos, dsin
