"""Core-periphery attention's declarations for the cross-op tools (see
:mod:`mmeffattn.ops._spec`)."""
import math
from typing import Any, Dict, Optional, Tuple

import torch

from .._spec import DTYPES, AotSpec, Cost, OpSpec, Roofline, randn, sdpa_macs, square_grid
from .op import core_periphery_attention, core_periphery_triton_reasons

#: VECA's largest core budget (benchmarks)
NUM_CORES = 64


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cores: int,
         **kwargs: Any) -> int:
    """The C cores attend over all ``C + N`` keys, the N patches over the C cores only."""
    B, nh, T, D = q.shape
    C = int(num_cores)
    return sdpa_macs(B * nh, C, T, D, v.shape[-1]) + sdpa_macs(B * nh, T - C, C, D, v.shape[-1])


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """``[B, heads, C + N, D]`` q, k, v with :data:`NUM_CORES` cores before the N patches."""
    hw = square_grid(n)
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(s.batch, s.heads, N + NUM_CORES, s.head_dim, device=device,
                           dtype=dtype) for _ in range(3))
    return (lambda b: core_periphery_attention(q, k, v, NUM_CORES, backend=b),
            macs(q, k, v, NUM_CORES), 4 * q.numel() * q.element_size(),
            dict(N=N, grid=list(hw), tokens=N + NUM_CORES, num_cores=NUM_CORES))


def gpu_check(B: int, h: int, C: int, N: int, D: int):
    def make(device, dtype):
        x = [randn(B, h, C + N, D, device=device, dtype=dtype) for _ in range(3)]
        ang = torch.rand(1, C + N, D // 2, device=device).repeat_interleave(2, -1) * 6.28
        rope = (ang.cos(), ang.sin())
        return (lambda b, q, k, v: core_periphery_attention(q, k, v, C, rope=rope, backend=b),
                x)
    return make


def implied_weights(q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int], rows: torch.Tensor,
                    num_cores: int = 16,
                    cores: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                    **_: Any) -> torch.Tensor:
    """A patch reads the C cores only; the cores read every token. The implied weight of patch
    ``j`` for patch ``i`` is the two-hop ``sum_c A[i, c] B[c, j]`` (patch -> core -> patch), with
    ``A`` the patch-to-core and ``B`` the core-to-patch softmax. Without a VECA model
    (``cores`` None) the cores are the tokens average pooled to a ``sqrt(C) x sqrt(C)`` grid."""
    from mmeffattn.analysis.dispersion import pool_grid
    scale = q.shape[-1] ** -0.5
    qs = q[:, :, rows.to(q.device)]  # [B, h, R, D]
    if cores is None:
        side = max(1, round(math.sqrt(num_cores)))
        cell = max(1, math.ceil(max(hw) / side))
        q_c, k_c = pool_grid(q, hw, cell), pool_grid(k, hw, cell)
    else:
        q_c, k_c = cores
    to_cores = ((qs @ k_c.transpose(-2, -1)) * scale).softmax(-1)  # [B, h, R, C]
    # a core reads cores and patches; keep its weights on the patches (renormalised) so the
    # two hops give a distribution over the N patches
    keys = torch.cat([k_c, k], dim=2)  # [B, h, C + N, D]
    from_cores = ((q_c @ keys.transpose(-2, -1)) * scale).softmax(-1)[..., k_c.shape[2]:]
    from_cores = from_cores / from_cores.sum(-1, keepdim=True)  # [B, h, C, N]
    return to_cores @ from_cores


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation
# ---------------------------------------------------------------------------------------------
def aot_case(D, C, dtype, rope='batch', splits=None, N=196, rope_grad=True) -> Dict[str, Any]:
    """``rope``: None, ``'batch'`` for ``[B, C + N, D]`` tables or ``'shared'`` for
    ``[1, C + N, D]``; ``splits``: None for the launchers' default, or a count forced to compile
    the split path; ``rope_grad``: the tables need gradients (VECA learns its core
    coordinates, so its tables do while training)."""
    return dict(op='core_periphery_attention', D=D, C=C, N=N, dtype=dtype, rope=rope,
                splits=splits, rope_grad=rope_grad)


def aot_record(case: Dict[str, Any]) -> list:
    """The launches of one forward + backward on views of ``[B, C + N, heads, D]``
    projections, as the VECA backbone passes them; the backward both fused (the default) and
    deterministic (``torch.use_deterministic_algorithms``), unless the case sets
    ``fused`` to one of them."""
    from . import function
    dtype = DTYPES[case['dtype']]
    B, heads, C, D = case.get('B', 2), case.get('heads', 2), case['C'], case['D']
    L = C + case['N']
    q, k, v = (torch.empty(B, L, heads, D, dtype=dtype).transpose(1, 2) for _ in range(3))
    cos = sin = None
    if case['rope']:
        cos, sin = (torch.empty(B if case['rope'] == 'batch' else 1, L, D, dtype=dtype)
                    for _ in range(2))
    scale = D ** -0.5
    with function.record_launches() as launches:
        o, lse = function.core_periphery_fwd(q, k, v, cos, sin, C, scale, splits=case['splits'])
        fused = case.get('fused')
        for f in ((True, False) if fused is None else (fused,)):
            function.core_periphery_bwd(torch.empty_like(o), q, k, v, cos, sin, o, lse, C,
                                        scale, splits=case['splits'],
                                        rope_grad=case.get('rope_grad', True), fused=f)
    return launches


# Only the tile class changes the compiled code: dtype, padded head dim BD and whether D == BD,
# the core block (next_pow2(C), 16 at least, capped at the long block), rope or not, and for the
# core rows' long loops whether they write the final tensors or fp32 partials (a split), plus
# Triton's alignment specialisation of pointers and strides. C in {8, 20, 64} reaches every core
# block (16, 32, 64; fp32 caps at 32, so 64 cores are two blocks there). The subset: VECA-S and
# VECA-B (head dim 64) with 8 and 64 cores and per-sample tables in every dtype, plus a
# broadcast table, the split path and no rope.
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(64, 8, 'fp16'), aot_case(64, 64, 'fp16'), aot_case(64, 64, 'bf16'),
            aot_case(64, 8, 'bf16'), aot_case(64, 8, 'fp32'), aot_case(64, 64, 'fp32', 'shared'),
            aot_case(64, 64, 'fp16', None, splits=2), aot_case(64, 64, 'bf16', 'batch', splits=2)],
    full=[aot_case(D, C, dtype, rope, splits=splits)
          for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
          for dtype in ('fp16', 'bf16', 'fp32')
          for C in (8, 20, 64)
          for rope in (None, 'batch', 'shared')
          for splits in (None, 2)],
    kernels=frozenset({'core_periphery_fwd_kernel', 'core_periphery_bwd_dq_kernel',
                       'core_periphery_bwd_dkdv_kernel',
                       'softmax_bwd_delta_kernel'}))

# ---------------------------------------------------------------------------------------------
# roofline
# ---------------------------------------------------------------------------------------------
#: SMs the launchers' split heuristic sees on the GPUs of the roofline (H100 / H200 SXM)
ROOFLINE_SMS = 132


def _splits(programs: int, loop_blocks: int) -> int:
    """``function.num_splits`` on ROOFLINE_SMS SMs."""
    from .function import MIN_BLOCKS_PER_SPLIT
    if programs >= 2 * ROOFLINE_SMS:
        return 1
    splits = max(1, min(-(-2 * ROOFLINE_SMS // programs), loop_blocks // MIN_BLOCKS_PER_SPLIT))
    return -(-loop_blocks // -(-loop_blocks // splits))


def roofline_costs(B: int, h: int, C: int, N: int, D: int, rope_grad: bool = False,
                   previous: bool = False, fused: Optional[bool] = None):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one call on ``[B, h, C + N, D]`` q, k,
    v with per-token rope tables shared by the batch (``[1, C + N, D]``, as the GPU checks pass
    them; ``rope_grad``: the tables need gradients too), as the kernels and their glue run.

    Bytes: every launch reads each row it needs once (rows re-read by the programs of one
    launch come from L2), the tables once per launch. Forward: the patch launch reads q, the
    core k and v, and writes o and the log-sum-exp; the core launch reads the core q and all of
    k and v, writing fp32 partials merged in PyTorch when its key loop is split. Backward: the
    delta pre-pass (o, dO read), then per side a dq and a dk/dv launch, each reading its own
    rows and the other side's, writing dq, dk, dv in the input dtype (the inverse rope is in
    their epilogues); the core rows' long loops split as the launchers split them (backward
    tiles). ``fused`` (None: where the launchers fuse, i.e. outside
    ``torch.use_deterministic_algorithms``, in the tile classes that have the fused kernels):
    three launches visit each pair once: the patch rows' (dq, plus their share of the cores'
    dk/dv), every key's (dk/dv from the core queries plus those sums, plus the cores' dq
    share), and the cores' dq (the sums through the rope), with a zeroed fp32
    ``[3, B*h, C, D]`` buffer for the sums, never split. Their fp32 atomics (``2 C D`` per
    16-row patch block, ``C D`` per 16-row key block: about ``(N / 2 + L / 4) C D`` bytes per
    head) resolve in L2 and are not counted as HBM bytes: a GPU run has to confirm they
    are cheap. Not fused: the dq and the dk/dv launch of each side both visit its pairs. With
    ``rope_grad`` the epilogues re-read q / k and write fp32 per-head table partials
    (4 planes), summed by one reduction per table.
    Tensor-core FLOPs: 2 per MAC; forward two products per (query, key) pair; backward S and dP
    in every launch that visits a pair (fused: once; not fused: twice), plus dV, dQ, dK once
    per pair. fp32 lane
    instructions: about 4 per score forward (scale, max, exp2, sum), 3 per score and visit
    backward (P and dS), and 3 per rotated element (two FMAs and a conversion) each time a
    q / k tile is loaded.

    ``previous``: the design before issue 14 (not fused): dq and dk of the rotated q, k written
    in fp32 and mapped back to q, k and the tables by PyTorch elementwise passes (per gradient
    ``g cos``, ``g sin``, the pair rotation, the difference, the cast: about 44 + itemsize bytes
    per element; with table gradients about 70 more per element and 10 more launches)."""
    from .function import core_periphery_bwd_tiles, core_periphery_tiles, padded_head_dim

    def costs(dtype: str) -> Dict[str, Cost]:
        torch_dtype = DTYPES[dtype]
        e = torch_dtype.itemsize
        L, bh = C + N, B * h
        bd = padded_head_dim(D)
        t = core_periphery_tiles(bd, bd == D, C, torch_dtype, True)
        bt = core_periphery_bwd_tiles(bd, bd == D, torch_dtype, True)
        fuse = (bt.fused_warps > 0 if fused is None else fused) and not previous
        row = bh * D * e  # bytes of one token row of q, k, v, o or dO over all heads
        tab = 2 * L * D * e  # cos and sin
        part = 4 * bh * C * D  # one fp32 partial of the core rows
        core = max(16, 1 << (C - 1).bit_length())  # the core side, padded

        # forward; split of the core rows' key loop (the launchers' heuristic)
        splits = _splits(-(-C // t.core_block) * bh, -(-L // t.long_block))
        fwd_bytes = (row * (N + 2 * C) + row * N + 4 * bh * N + tab  # patch rows
                     + row * (C + 2 * L) + row * C + 4 * bh * C + tab)  # core rows
        fwd_launches = 2
        if splits > 1:  # partials written, merged (logsumexp, exp2, einsum, cast, lse copy)
            fwd_bytes += 2 * splits * (part + 4 * bh * C) + 2 * part + row * C
            fwd_launches += 5
        pairs = bh * (C * L + N * C)
        fwd_fp32 = 4 * pairs + 3 * bh * D * (L + N // t.long_block * C + L)
        fwd = Cost(fwd_bytes, fp32=fwd_fp32, tc=2 * 2 * pairs * D, launches=fwd_launches)

        # backward: the delta pre-pass, then
        dq_patches = row * (2 * N + 2 * C) + 8 * bh * N + tab + row * N
        if fuse:  # patch rows (dq + the cores' dk/dv share), every key's dk/dv (+ the cores'
            # dq share), the cores' dq through the rope; the [3, bh, C, D] buffer zeroed first
            splits = 1
            bwd_bytes = (2 * row * L + 4 * bh * L + 3 * part
                         + dq_patches
                         + row * (2 * L + 2 * C) + 8 * bh * C + tab + 2 * part + 2 * row * L
                         + 2 * row * C + 8 * bh * C + tab + part + row * C)
            bwd_launches = 5
        else:  # dq and dk/dv of the patch rows, then of the core rows (long loops split)
            splits = _splits(-(-C // min(core, bt.row_block)) * bh, -(-L // bt.loop_block))
            bwd_bytes = (2 * row * L + 4 * bh * L
                         + dq_patches
                         + row * (2 * N + 2 * C) + 8 * bh * C + tab + 2 * row * N
                         + row * (2 * C + 2 * L) + 8 * bh * C + tab + row * C
                         + row * (2 * C + 2 * L) + 8 * bh * L + tab + 2 * row * C)
            bwd_launches = 5
        if splits > 1:  # partials written, read, summed into dq, dk, dv of the core rows
            bwd_bytes += 3 * (2 * splits * part + row * C)
            bwd_launches += 3
        if previous:  # fp32 dq, dk, then the PyTorch inverse-rope passes
            g = bh * L * D
            bwd_bytes += 2 * g * (4 - e) + 2 * g * (44 + e) + 2 * tab
            bwd_launches += 12
            if rope_grad:
                bwd_bytes += 70 * g
                bwd_launches += 10
        elif rope_grad:  # q / k re-read, 4 fp32 planes written and summed, tables written
            bwd_bytes += 2 * row * L + 2 * 16 * bh * L * D + 2 * L * D * (4 + e)
            bwd_launches += 2 + (2 if e < 4 else 0)
            if splits > 1:  # the table partials of the split launches (dq's and dk's)
                bwd_bytes += 2 * 2 * (2 * splits * 2 * part)
                bwd_launches += 2
        visits = (1 if fuse else 2) * pairs
        bwd_fp32 = 3 * visits + 2 * 3 * bh * D * (2 * L + 2 * C)
        bwd = Cost(bwd_bytes, fp32=bwd_fp32, tc=2 * D * (2 * visits + 3 * pairs),
                   launches=bwd_launches)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def roofline(B: int, h: int, C: int, N: int, D: int) -> Roofline:
    return Roofline(check=f'core_periphery B{B}-H{h}-C{C}-N{N}-D{D}',
                    costs=roofline_costs(B, h, C, N, D),
                    aot_case=dict(aot_case(D, C, 'bf16', 'shared', N=N, rope_grad=False),
                                  B=B, heads=h, fused=True),  # the default backward only
                    previous=roofline_costs(B, h, C, N, D, previous=True))


SPEC = OpSpec(
    name='core_periphery_attention', macs=macs, can_run=core_periphery_triton_reasons,
    # VECA-S (C=64) at 224 and 512
    gpu_checks=[('core_periphery B8-H6-C64-N196-D64', gpu_check(8, 6, 64, 196, 64)),
                ('core_periphery B2-H6-C64-N1024-D64', gpu_check(2, 6, 64, 1024, 64))],
    benchmarks={'core_periphery': benchmark}, benchmark_settings=dict(num_cores=NUM_CORES),
    attention_kinds={'core_periphery': implied_weights}, aot=AOT,
    rooflines=[roofline(8, 6, 64, 196, 64), roofline(2, 6, 64, 1024, 64)])
