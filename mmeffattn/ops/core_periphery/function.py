"""Launchers of the Triton core-periphery attention kernels (autograd: ``library.py``).

Forward: two launches (patch rows over the C core keys; core rows over all keys, optionally
split). Backward: the ``delta`` pre-pass, then either the fused three launches (fp32 atomics,
the default) or four deterministic ones. The launch plan is in docs/design/ops_kernels.md.
"""
import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch

from .._launch import (KernelConfig, device_guard as _device_guard, launch as _launch,
                       next_pow2 as _next_pow2, unit_last_stride as _unit_last_stride)
from .._common import autocast_off, bh_strides as _strides
from .._common import check_token_offsets as _check_int32_offsets
from .._common_kernels import delta_config, softmax_bwd_delta
from . import kernels

DEFAULT_INPUT_PRECISION = 'ieee'  # fp32 ``tl.dot``: exact, not TF32
MIN_BLOCKS_PER_SPLIT = 4  # fewer: the partials' reduction outweighs the parallelism


class Tiles(NamedTuple):
    core_block: int  # rows per block on the core side (C padded, at most ``long_block``)
    long_block: int  # rows per block on the token side (patch queries / keys)
    warps: int
    stages: int


#: forward ``(block, warps, stages)`` by (fp32, BD, D == BD, rope): the largest candidate that
#: compiles without a spill on sm_80 and sm_90 (docs/design/ops_kernels.md).
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
    """Forward tiles for padded head dim ``bd`` (``even_d``: D == BD); the core side is one
    block of ``next_pow2(C)`` rows (>= 16) up to the table's block."""
    block, warps, stages = TILE_TABLE[(dtype == torch.float32, bd, even_d, rope)]
    return Tiles(min(block, max(16, _next_pow2(num_cores))), block, warps, stages)


class BwdTiles(NamedTuple):
    row_block: int  # rows a backward program owns (its fp32 accumulators)
    loop_block: int  # rows per step of its loop (on sm_80 the mma B operands, whole per warp)
    warps: int
    stages: int
    maxnreg: Optional[int] = None  # register cap per thread (None: ptxas decides)
    fused_warps: int = 0  # warps of the fused backward's kernels (0: not used)


def _bwd_tiles(fp32: bool, bd: int, even: bool) -> Tuple[int, int, int, int]:
    """Backward ``(row, loop, warps, stages)``: no spill, dk/dv within 128 registers."""
    row = 32 if (even and bd < 128) else 16
    if not fp32:
        return row, 16, 4, 1
    return row, 16, 4 if (bd == 128 and even) else 8, 1


def _fused_warps(fp32: bool, bd: int, even: bool, warps: int) -> int:
    """Warps of the fused backward's kernels; 0 (separate kernels) where none fit in 128
    registers (BD = 128 with D < BD)."""
    if bd == 128 and not even:
        return 0
    if bd == 128 or (bd == 64 and not even and not fp32):
        return 8
    return warps


#: classes whose backward spilled under ptxas's own register choice; capped at BWD_MAXNREG
BWD_CAPPED = frozenset({(True, 32, False, True), (True, 32, True, True),
                        (True, 128, False, False)})
BWD_MAXNREG = 128  # the dk/dv budget (two CTAs per SM)


def core_periphery_bwd_tiles(bd: int, even_d: bool, dtype: torch.dtype, rope: bool) -> BwdTiles:
    """The backward kernels' tiles for padded head dim ``bd`` (``even_d``: D == BD)."""
    fp32 = dtype == torch.float32
    row, loop, warps, stages = _bwd_tiles(fp32, bd, even_d)
    maxnreg = BWD_MAXNREG if (fp32, bd, even_d, rope) in BWD_CAPPED else None
    return BwdTiles(row, loop, warps, stages, maxnreg, _fused_warps(fp32, bd, even_d, warps))


def padded_head_dim(head_dim: int) -> int:
    """BD: the head dim padded to a power of two, at least 16 (a ``tl.dot`` operand)."""
    return max(16, _next_pow2(head_dim))


def core_periphery_kernel_configs(head_dim: int, num_cores: int, dtype: torch.dtype, rope: bool,
                      input_precision: str = DEFAULT_INPUT_PRECISION,
                      rope_grad: bool = False, fused: bool = True) -> Dict[str, KernelConfig]:
    """The launchers' configurations by role: ``fwd_patches``, ``fwd_cores``,
    ``bwd_preprocess``, then fused ``bwd_patches``, ``bwd_keys``, ``bwd_dq_cores`` or
    deterministic ``bwd_{dq,dkdv}_{patches,cores}``. ``rope_grad``: also the tables' gradients."""
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
            'bwd_patches': bwd(dq, loop, min(core, loop), bt.fused_warps, KV_ATOMIC=True,
                               **no_acc),
            'bwd_keys': bwd(dkdv, min(core, loop), loop, bt.fused_warps, BWD_MAXNREG,
                            ACC_INIT=True, Q_ATOMIC=True),
            'bwd_dq_cores': bwd(dq, min(core, loop), loop, KV_ATOMIC=False, ACC_INIT=True)})
    else:
        cfgs.update({
            'bwd_dq_patches': bwd(dq, row, min(core, loop), KV_ATOMIC=False, **no_acc),
            'bwd_dkdv_patches': bwd(dkdv, min(core, loop), row, Q_ATOMIC=False, **no_acc),
            'bwd_dq_cores': bwd(dq, min(core, row), loop, KV_ATOMIC=False, **no_acc),
            'bwd_dkdv_cores': bwd(dkdv, loop, min(core, row), Q_ATOMIC=False, **no_acc)})
    return cfgs


def use_fused_backward() -> bool:
    """Fused backward (fp32 atomics) unless ``torch.use_deterministic_algorithms`` is on."""
    return not torch.are_deterministic_algorithms_enabled()


def num_splits(n_programs: int, n_loop_blocks: int, device: torch.device,
               splits: Optional[int] = None) -> Tuple[int, int]:
    """``(n_splits, blocks_per_split)`` of a long loop (flash-decoding): the few core rows
    would occupy a handful of SMs, so the loop is split to about two programs per SM.
    ``splits`` forces a count; on the CPU the default is no split."""
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
    """``(stride_rb, stride_rn)`` of a ``[B or 1, L, D]`` rope table (0: shared over B)."""
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def _rope_inputs(q: torch.Tensor, k: torch.Tensor, cos: Optional[torch.Tensor],
                 sin: Optional[torch.Tensor]) -> Tuple[Any, ...]:
    """``(q, k, cos, sin, stride_rb, stride_rn)`` kernel arguments (q stands in for absent
    tables). With rope, q, k and the tables get every row starting at an even element (a
    channel pair is one load; a copy only for unusual views, judged by the storage offset: fake
    tensors have no data_ptr), and the tables one set of strides."""
    if cos is None:
        return q, k, q, q, 0, 0
    q, k, cos, sin = (x if all(st % 2 == 0 for st in x.stride()[:-1])
                      and x.storage_offset() % 2 == 0 else x.contiguous()
                      for x in (q, k, cos, sin))
    if _table_strides(cos) != _table_strides(sin):
        cos, sin = cos.contiguous(), sin.contiguous()
    return (q, k, cos, sin, *_table_strides(cos))


def core_periphery_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], num_cores: int,
                       scale: float, input_precision: str = DEFAULT_INPUT_PRECISION,
                       splits: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward: q, k, v ``[B, heads, C + N, D]``; cos, sin None or ``[B or 1, C + N, D]``.
    Returns o (q's layout and dtype) and lse ``[B*heads, C + N]`` (fp32, log2)."""
    B, nh, L, D = q.shape
    C, N, BH = num_cores, L - num_cores, B * q.shape[1]
    cfgs = core_periphery_kernel_configs(D, C, q.dtype, cos is not None, input_precision)
    q, k, cos, sin, stride_rb, stride_rn = _rope_inputs(q, k, cos, sin)
    o = torch.empty((B, nh, L, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((BH, L), dtype=torch.float32, device=q.device)
    _check_int32_offsets(q, k, v, o)
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
            # merge the splits' softmaxes by their share of the mass, in fp32
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
    """Backward: ``(dq, dk, dv, dcos, dsin)``; dcos, dsin only with rope and ``rope_grad``.
    ``fused`` (None: :func:`use_fused_backward`) sums shared gradients with fp32 atomics."""
    B, nh, L, D = q.shape
    C, N, BH = num_cores, L - num_cores, B * q.shape[1]
    rope = cos is not None
    rope_grad = rope and rope_grad
    fused = use_fused_backward() if fused is None else fused
    cfgs = core_periphery_kernel_configs(D, C, q.dtype, rope, input_precision, rope_grad, fused)
    fused = 'bwd_patches' in cfgs  # not in every tile class (:func:`_fused_warps`)
    do = _unit_last_stride(do)
    tables = cos
    q, k, cos, sin, stride_rb, stride_rn = _rope_inputs(q, k, cos, sin)
    dq = torch.empty((B, nh, L, D), dtype=q.dtype, device=q.device)
    dk, dv = torch.empty_like(dq), torch.empty_like(dq)
    # per-(batch, head) table gradients: [source (q, k), table (cos, sin), B*heads, L, D]
    dtab = (torch.empty((2, 2, BH, L, D), dtype=torch.float32, device=q.device) if rope_grad
            else dq.new_empty(0))
    _check_int32_offsets(q, k, v, do, dq)
    inputs = (q, k, v, cos, sin, do, lse)
    strides = (*_strides(q), *_strides(k), *_strides(v), stride_rb, stride_rn, *_strides(do))
    out_strides = (0, L * D, D)
    tab_strides = (0, L * D, BH * L * D, D) if rope_grad else (0, 0, 0, 0)
    # fused: the cores' dk, dv, dq summed by the launches that meet them from the other side
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
        """Programs own rows ``[start, start + n_rows)``, loop over ``[0, n_loop)``."""
        own, loop = blocks(role)
        n_blocks = -(-n_rows // own)
        per_split = -(-n_loop // loop) if per_split is None else per_split
        _launch(role, cfgs[role], (n_blocks * n_splits * BH,), *inputs, delta, *grads, table,
                acc_ptr, *strides, *g_strides, *t_strides, *acc_strides, nh, start, n_rows,
                n_loop, n_blocks, n_splits, per_split, start, L, scale, D)

    def core_launch(role: str, grads: Tuple[torch.Tensor, ...], table: int) -> None:
        """Core rows ``[0, C)`` against all L rows; split loops sum fp32 partials here."""
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
            # patch rows over the core keys; patch keys from the core queries
            launch('bwd_dq_patches', (dq,), tab(0), acc, C, N, C)
            launch('bwd_dkdv_patches', (dk, dv), tab(1), acc, C, N, C)
            # the core rows [0, C) over all keys; the core keys from all queries
            core_launch('bwd_dq_cores', (dq,), 0)
            core_launch('bwd_dkdv_cores', (dk, dv), 1)
    dcos = dsin = None
    if rope_grad:  # sum over source and heads; two separate tensors (custom ops need that)
        dims = (0, 2, 3) if tables.shape[0] == 1 else (0, 1, 3)
        dcos, dsin = (dtab[:, i:i + 1].view(2, 1, B, nh, L, D).sum(dims).to(tables.dtype)
                      for i in range(2))
    return dq, dk, dv, dcos, dsin
