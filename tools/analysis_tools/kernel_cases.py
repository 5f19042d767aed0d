"""The Triton launches and analytic costs of each op at the backbones' sizes, for the tools
and tests that look at compiled kernels without running them.

* :func:`record`: the launches an op's launchers really issue for one case (forward and
  backward, inside ``_launch.record_launches()``); :func:`specialise`, Triton's JIT
  specialisation of one launch, and :func:`compile_launch`, its compile for an NVIDIA target
  without a GPU: what ``tests/ops/test_aot.py`` and ``kernel_report.py`` run.
* :data:`ROOFLINES`: per GPU check of ``tools/gpu_check.py``, the bytes and work of one call
  (kernels and glue) and its predicted time at peak rates (:func:`predicted_seconds`).
  ``docs/perf/kernels_history.md`` records the rooflines of earlier kernel designs.
"""
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, NamedTuple, Optional

import torch

from mmeffattn.ops._spec import DTYPES
from mmeffattn.ops.sema.spec import window_sides

#: the backbones' settings the cases use: SEMA's window, WeightFormer's dynamic kernel side
SEMA_WINDOW, DWCONV_KERNEL = 7, 3


class Cost(NamedTuple):
    """What one pass of an op moves and computes on a GPU, kernels and glue together.

    ``bytes``: HBM bytes every call must read and write (inputs, outputs, saved and
    intermediate tensors, each as often as the implementation touches it). ``fp32``: fp32
    CUDA-core lane instructions (an FADD, FMUL, FFMA or MUFU counts 1, so the peak is half the
    fp32 FLOP/s figure). ``tc``: tensor-core FLOPs (2 per MAC) at the op's dot precision.
    ``launches``: kernel and glue launches (a floor of a few microseconds each)."""
    bytes: int
    fp32: int = 0
    tc: int = 0
    launches: int = 1


#: peak rates per GPU: HBM bytes/s, fp32 lane instructions/s (fp32 FLOP/s / 2), dense tensor-core
#: FLOP/s for 16-bit inputs and for tf32 (fp32 inputs; ``tf32x3`` is three tf32 products)
PEAKS: Dict[str, Dict[str, float]] = {
    'H100': dict(hbm=3.35e12, fp32=67e12 / 2, tc16=989e12, tf32=495e12),
    'H200': dict(hbm=4.8e12, fp32=67e12 / 2, tc16=989e12, tf32=495e12),
}


def predicted_seconds(cost: Cost, gpu: str, dtype: str) -> float:
    """The roofline time of ``cost`` on ``gpu``: the larger of the HBM time and the compute
    time (CUDA-core and tensor-core work added, as they share issue slots); no launch
    latency (``cost.launches`` says how many there are)."""
    peak = PEAKS[gpu]
    tc_peak = peak['tf32'] if dtype == 'fp32' else peak['tc16']
    return max(cost.bytes / peak['hbm'], cost.fp32 / peak['fp32'] + cost.tc / tc_peak)


def total_cost(costs: Dict[str, Cost]) -> Cost:
    """The fields of ``costs`` (e.g. forward and backward) summed."""
    return Cost(*(sum(getattr(c, f) for c in costs.values()) for f in Cost._fields))


# --------------------------------------------------------------------------------------------
# recorded launches
# --------------------------------------------------------------------------------------------
def sema_case(D, window, H, W, dtype, with_mean=True, layout='backbone',
              return_mean=False, **extra) -> Dict[str, Any]:
    return dict(op='sema_attention', D=D, window=window, H=H, W=W, dtype=dtype,
                with_mean=with_mean, layout=layout, return_mean=return_mean, **extra)


def core_periphery_case(D, C, dtype, rope='batch', splits=None, N=196, rope_grad=True,
                        **extra) -> Dict[str, Any]:
    """``rope``: None, ``'batch'`` for ``[B, C + N, D]`` tables or ``'shared'`` for
    ``[1, C + N, D]``; ``splits``: None for the launchers' default, or a count forced to compile
    the split path; ``rope_grad``: the tables need gradients (VECA learns its core
    coordinates, so its tables do while training); ``fused``: one backward (default both)."""
    return dict(op='core_periphery_attention', D=D, C=C, N=N, dtype=dtype, rope=rope,
                splits=splits, rope_grad=rope_grad, **extra)


def laplacian_case(N, M, D, dtype, layout='contiguous', **extra) -> Dict[str, Any]:
    """``layout``: ``'contiguous'`` or ``'tokens'`` (views of a ``[B, tokens, heads, D]``
    projection)."""
    return dict(op='laplacian_kernel', N=N, M=M, D=D, dtype=dtype, layout=layout, **extra)


def newton_schulz_case(M, iters=3, dtype='fp32', **extra) -> Dict[str, Any]:
    return dict(op='newton_schulz_pinv', M=M, iters=iters, dtype=dtype, **extra)


def dynamic_dwconv_case(C, H, W, K, dtype, layout='tokens', normalize=True, weight=True,
                        bias=True, B=2) -> Dict[str, Any]:
    return dict(op='dynamic_dwconv', B=B, C=C, H=H, W=W, K=K, dtype=dtype, normalize=normalize,
                weight=weight, bias=bias, layout=layout)


def dynamic_weight_case(M, C_in, C_out, dtype, weight='fp32', B=2) -> Dict[str, Any]:
    return dict(op='dynamic_weight', B=B, M=M, C_in=C_in, C_out=C_out, dtype=dtype,
                weight=weight)


def _record_sema(case: Dict[str, Any]) -> list:
    """``'backbone'`` layout: q, k views of a fused qk projection and dq, dk stored into one
    packed gradient (``sema_attention_qk``), v a transposed ``[B, N, heads, D]``, the output
    stored tokens-major; ``return_mean``: the mean returned, as the backbone calls it, and its
    gradient read by the backward. ``'contiguous'``: ``[B, heads, N, D]`` q, k, v."""
    from mmeffattn.ops.sema import function
    dtype = DTYPES[case['dtype']]
    H, W, D = case['H'], case['W'], case['D']
    B, nh = case.get('B', 1), case.get('heads', 2)  # the launch grid depends on them
    return_mean = case.get('return_mean', False)
    out_layout, dqk = 'bhnd', None
    if case.get('layout', 'backbone') == 'backbone':
        qk = torch.empty(B, H * W, 2, nh, D, dtype=dtype)
        q, k = function.qk_views(qk)
        dqk = torch.empty_like(qk)
        v = torch.empty(B, H * W, nh, D, dtype=dtype).transpose(1, 2)
        out_layout = 'bnhd'
    else:
        q, k, v = (torch.empty(B, nh, H * W, D, dtype=dtype) for _ in range(3))
    geom = function.window_geometry((H, W), case['window'])
    scale = D ** -0.5
    with function.record_launches() as launches:
        o, lse, mean = function.sema_fwd(q, k, v, geom, scale, case['with_mean'],
                                         out_layout=out_layout, return_mean=return_mean)
        function.sema_bwd(torch.empty_like(o), q, k, v, o, lse, mean, geom, scale,
                          case['with_mean'], out_layout=out_layout, dqk=dqk,
                          grad_mean=torch.empty_like(mean) if return_mean else None,
                          return_mean=return_mean)
    return launches


def _record_core_periphery(case: Dict[str, Any]) -> list:
    """Views of ``[B, C + N, heads, D]`` projections, as the VECA backbone passes them; the
    backward both fused (the default) and deterministic, unless the case sets ``fused``."""
    from mmeffattn.ops.core_periphery import function
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


def _record_laplacian(case: Dict[str, Any]) -> list:
    from mmeffattn.ops.laplacian import function
    dtype = DTYPES[case['dtype']]
    N, M, D = case['N'], case['M'], case['D']
    B, H = case.get('B', 1), case.get('H', 2)
    if case.get('layout', 'contiguous') == 'tokens':
        x = torch.empty(B, N, H, D, dtype=dtype).transpose(1, 2)
        y = torch.empty(B, M, H, D, dtype=dtype).transpose(1, 2)
    else:
        x, y = torch.empty(B, H, N, D, dtype=dtype), torch.empty(B, H, M, D, dtype=dtype)
    with function.record_launches() as launches:
        out = function.laplacian_fwd(x, y, 1.0)
        function.laplacian_bwd(torch.empty_like(out), x, y, out, 1.0)
    return launches


def _record_newton_schulz(case: Dict[str, Any]) -> list:
    """The forward keeping its iterates, the inference forward (nothing stored), the
    backward."""
    from mmeffattn.ops.newton_schulz import function
    M, iters = case['M'], case['iters']
    from mmeffattn.ops.newton_schulz.op import MAX_TRITON_M
    assert M <= MAX_TRITON_M, 'larger matrices run the torch backend, no kernel'
    a = torch.empty(case.get('B', 1), case.get('heads', 2), M, M, dtype=DTYPES[case['dtype']])
    from mmeffattn.ops._launch import record_launches
    with record_launches() as launches:
        out, ws = function.newton_schulz_fwd(a, iters, 0.01, True)
        function.newton_schulz_fwd(a, iters, 0.01, False)
        function.newton_schulz_bwd(torch.empty_like(out), a, ws, iters, 0.01)
    return launches


def _record_dynamic_dwconv(case: Dict[str, Any]) -> list:
    """``'tokens'``: the channels-last view of a ``[B, H*W, C]`` token tensor, as the model
    passes it; ``'nchw'``: plain NCHW."""
    from mmeffattn.ops.dynamic_dwconv import function
    dtype = DTYPES[case['dtype']]
    B, C, H, W, K = case['B'], case['C'], case['H'], case['W'], case['K']
    if case['layout'] == 'tokens':
        x = torch.empty(B, H * W, C, dtype=dtype).transpose(1, 2).reshape(B, C, H, W)
    else:
        x = torch.empty(B, C, H, W, dtype=dtype)
    kernel = torch.empty(B, C, K, K, dtype=dtype)
    weight = torch.empty(C, 1, K, K) if case['weight'] else None
    bias = torch.empty(C) if case['bias'] else None
    with function.record_launches() as launches:
        out = function.dynamic_dwconv_fwd(x, kernel, bias, weight, case['normalize'])
        function.dynamic_dwconv_bwd(torch.empty_like(out), x, kernel, weight, case['normalize'],
                                    bias is not None)
    return launches


def _record_dynamic_weight(case: Dict[str, Any]) -> list:
    """Contiguous u, v (the model's ``SiLU(A) @ basis``)."""
    from mmeffattn.ops.dynamic_weight import function
    dtype = DTYPES[case['dtype']]
    B, M, C_in, C_out = case['B'], case['M'], case['C_in'], case['C_out']
    u, v = torch.empty(B, M, C_in, dtype=dtype), torch.empty(B, M, C_out, dtype=dtype)
    weight = (torch.empty(C_out, C_in, dtype=DTYPES[case['weight']]) if case['weight']
              else None)
    s = C_in ** -0.5 / (4 * M)
    with function.record_launches() as launches:
        out = function.dynamic_weight_fwd(u, v, s, weight)
        function.dynamic_weight_bwd(torch.empty_like(out), u, v, s)
    return launches


_RECORDS: Dict[str, Callable[[Dict[str, Any]], list]] = {
    'sema_attention': _record_sema, 'core_periphery_attention': _record_core_periphery,
    'laplacian_kernel': _record_laplacian, 'newton_schulz_pinv': _record_newton_schulz,
    'dynamic_dwconv': _record_dynamic_dwconv, 'dynamic_weight': _record_dynamic_weight}


def record(case: Dict[str, Any]) -> list:
    """The launches of one forward + backward of ``case['op']`` at the case's shapes, recorded
    on empty CPU tensors (nothing runs)."""
    if case['op'] not in _RECORDS:
        raise ValueError(f"no recorded launches for op {case['op']!r}; ops: {sorted(_RECORDS)}")
    return _RECORDS[case['op']](case)


def specialise(launch, arch: int):
    """(target, signature, constexprs, attrs, options) exactly as Triton's JIT derives them from
    the launch's arguments (uses Triton internals: a Triton upgrade that changes them fails
    loudly)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget('cuda', arch, 32)
    backend = make_backend(target)
    kernel = launch.config.kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(launch.config.constexprs, **launch.config.launch_options)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args,
                                                              specialization, options)
    return target, signature, constexprs, attrs, options


def compile_launch(launch, arch: int, sass: bool = False) -> Dict[str, Any]:
    """Compile one recorded launch for ``sm_<arch>`` as the JIT would (Triton's interpreter
    off): registers, stack, local and shared memory (``cuobjdump -res-usage``), compile
    seconds, the PTX and, with ``sass``, the SASS text (``cuobjdump -sass``)."""
    import triton
    from triton.compiler import ASTSource
    target, signature, constexprs, attrs, options = specialise(launch, arch)
    t0 = time.time()
    compiled = triton.compile(ASTSource(launch.config.kernel, signature, constexprs, attrs),
                              target=target, options=options.__dict__)
    seconds = time.time() - t0
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(compiled.asm['cubin'])
        f.flush()
        usage, text = (subprocess.run([cuobjdump, flag, f.name], check=True, capture_output=True,
                                      text=True).stdout if want else ''
                       for flag, want in (('-res-usage', True), ('-sass', sass)))
    m = re.search(r'REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)', usage)
    if m is None:
        raise RuntimeError(f'cannot parse cuobjdump output:\n{usage}')
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(4)),
                shared=compiled.metadata.shared, seconds=round(seconds, 2),
                ptx=compiled.asm.get('ptx', ''), sass=text)


# --------------------------------------------------------------------------------------------
# rooflines: costs(dtype) -> {'fwd': Cost, 'bwd': Cost} of one call
# --------------------------------------------------------------------------------------------
def sema_costs(B: int, h: int, side: int, D: int):
    """One call on ``[B, h, side**2, D]`` q, k, v in windows of :data:`SEMA_WINDOW`, as the SEMA
    backbone makes it: q, k packed in the qk projection's output (``sema_attention_qk``), the
    output stored tokens-major, the mean returned (the backbone adds it at the call site).
    Forward: the kernel (q, k, v read, o stored into ``[B, N, heads, D]``;
    with several blocks per window the fp32 log-sum-exp) also writes each block's fp32 value
    sum (the several-block kernel reads its block's v rows once more), one sum of those
    partials per (batch, head) into the mean, and in 16-bit dtypes its cast. Backward: the
    delta pre-pass with several blocks (o, dO read; delta written), the kernel (q, k, v, dO and
    the mean's gradient read; lse and delta with several blocks; dq, dk written into the packed
    gradient, dv in v's layout).

    A window of 49 tokens is one block in 16-bit dtypes (no lse, no delta, no pre-pass) and
    four 16-token blocks in fp32. Tensor-core FLOPs: 2 per MAC, two products forward, five
    backward (S recomputed, dP, dV, dQ, dK); fp32 lane instructions: about 4 per score forward
    (scale, max, exp, sum) and 6 backward."""
    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        N = side * side
        t = B * h * N * D * e  # one [B, h, N, D] tensor
        row = 4 * B * h * N  # one fp32 value per token (lse, delta)
        sides = window_sides(side, SEMA_WINDOW)
        pairs = B * h * sum((a * b) ** 2 for a in sides for b in sides)
        tokens = min(SEMA_WINDOW, side) ** 2
        several = dtype == 'fp32' or tokens > 64
        assert dtype == 'fp32' or not several, 'a 16-bit window over 64 tokens: not modelled'
        n_parts = len(sides) ** 2 * (-(-tokens // 16) if several else 1)
        cast = dtype != 'fp32'
        # the kernel; the partial sums written and read; the mean written (and cast)
        fwd_bytes = 4 * t + (row if several else 0) + 2 * 4 * B * h * n_parts * D \
            + 4 * B * h * D + ((4 + e) * B * h * D if cast else 0)
        # the kernel, the mean's gradient; the pre-pass
        bwd_bytes = 7 * t + B * h * D * e + (2 * t + 3 * row if several else 0)
        return dict(fwd=Cost(fwd_bytes, fp32=4 * pairs, tc=2 * 2 * pairs * D,
                             launches=2 + int(cast)),
                    bwd=Cost(bwd_bytes, fp32=6 * pairs, tc=5 * 2 * pairs * D,
                             launches=1 + int(several)))
    return costs


#: SMs the launchers' split heuristic sees on the GPUs of the roofline (H100 / H200 SXM)
ROOFLINE_SMS = 132


def _core_periphery_splits(programs: int, loop_blocks: int) -> int:
    """``function.num_splits`` on :data:`ROOFLINE_SMS` SMs."""
    from mmeffattn.ops.core_periphery.function import MIN_BLOCKS_PER_SPLIT
    if programs >= 2 * ROOFLINE_SMS:
        return 1
    splits = max(1, min(-(-2 * ROOFLINE_SMS // programs), loop_blocks // MIN_BLOCKS_PER_SPLIT))
    return -(-loop_blocks // -(-loop_blocks // splits))


def core_periphery_costs(B: int, h: int, C: int, N: int, D: int, rope_grad: bool = False,
                         fused: Optional[bool] = None):
    """One call on ``[B, h, C + N, D]`` q, k, v with per-token rope tables shared by the batch
    (``[1, C + N, D]``, as the GPU checks pass them; ``rope_grad``: the tables need gradients
    too), as the kernels and their glue run.

    Bytes: every launch reads each row it needs once (rows re-read by the programs of one
    launch come from L2), the tables once per launch. Forward: the patch launch reads q, the
    core k and v, and writes o and the log-sum-exp; the core launch reads the core q and all of
    k and v, writing fp32 partials merged in PyTorch when its key loop is split. Backward: the
    delta pre-pass (o, dO read), then per side a dq and a dk/dv launch, each reading its own
    rows and the other side's, writing dq, dk, dv in the input dtype (the inverse rope is in
    their epilogues); the core rows' long loops split as the launchers split them. ``fused``
    (None: where the launchers fuse, i.e. outside ``torch.use_deterministic_algorithms``, in
    the tile classes that have the fused kernels): three launches visit each pair once (the
    patch rows' dq plus their share of the cores' dk/dv; every key's dk/dv plus the cores' dq
    share; the cores' dq through the rope), with a zeroed fp32 ``[3, B*h, C, D]`` buffer for
    the sums, never split. Their fp32 atomics resolve in L2 and are not counted as HBM bytes.
    Not fused: the dq and the dk/dv launch of each side both visit its pairs. With
    ``rope_grad`` the epilogues re-read q / k and write fp32 per-head table partials
    (4 planes), summed by one reduction per table.
    Tensor-core FLOPs: 2 per MAC; forward two products per (query, key) pair; backward S and dP
    in every launch that visits a pair, plus dV, dQ, dK once per pair. fp32 lane instructions:
    about 4 per score forward (scale, max, exp2, sum), 3 per score and visit backward (P and
    dS), and 3 per rotated element each time a q / k tile is loaded."""
    from mmeffattn.ops.core_periphery.function import (core_periphery_bwd_tiles,
                                                       core_periphery_tiles, padded_head_dim)

    def costs(dtype: str) -> Dict[str, Cost]:
        torch_dtype = DTYPES[dtype]
        e = torch_dtype.itemsize
        L, bh = C + N, B * h
        bd = padded_head_dim(D)
        t = core_periphery_tiles(bd, bd == D, C, torch_dtype, True)
        bt = core_periphery_bwd_tiles(bd, bd == D, torch_dtype, True)
        fuse = bt.fused_warps > 0 if fused is None else fused
        row = bh * D * e  # bytes of one token row of q, k, v, o or dO over all heads
        tab = 2 * L * D * e  # cos and sin
        part = 4 * bh * C * D  # one fp32 partial of the core rows
        core = max(16, 1 << (C - 1).bit_length())  # the core side, padded

        splits = _core_periphery_splits(-(-C // t.core_block) * bh, -(-L // t.long_block))
        fwd_bytes = (row * (N + 2 * C) + row * N + 4 * bh * N + tab  # patch rows
                     + row * (C + 2 * L) + row * C + 4 * bh * C + tab)  # core rows
        fwd_launches = 2
        if splits > 1:  # partials written, merged (logsumexp, exp2, einsum, cast, lse copy)
            fwd_bytes += 2 * splits * (part + 4 * bh * C) + 2 * part + row * C
            fwd_launches += 5
        pairs = bh * (C * L + N * C)
        fwd_fp32 = 4 * pairs + 3 * bh * D * (L + N // t.long_block * C + L)
        fwd = Cost(fwd_bytes, fp32=fwd_fp32, tc=2 * 2 * pairs * D, launches=fwd_launches)

        dq_patches = row * (2 * N + 2 * C) + 8 * bh * N + tab + row * N
        if fuse:
            splits = 1
            bwd_bytes = (2 * row * L + 4 * bh * L + 3 * part
                         + dq_patches
                         + row * (2 * L + 2 * C) + 8 * bh * C + tab + 2 * part + 2 * row * L
                         + 2 * row * C + 8 * bh * C + tab + part + row * C)
        else:  # dq and dk/dv of the patch rows, then of the core rows (long loops split)
            splits = _core_periphery_splits(-(-C // min(core, bt.row_block)) * bh,
                                            -(-L // bt.loop_block))
            bwd_bytes = (2 * row * L + 4 * bh * L
                         + dq_patches
                         + row * (2 * N + 2 * C) + 8 * bh * C + tab + 2 * row * N
                         + row * (2 * C + 2 * L) + 8 * bh * C + tab + row * C
                         + row * (2 * C + 2 * L) + 8 * bh * L + tab + 2 * row * C)
        bwd_launches = 5
        if splits > 1:  # partials written, read, summed into dq, dk, dv of the core rows
            bwd_bytes += 3 * (2 * splits * part + row * C)
            bwd_launches += 3
        if rope_grad:  # q / k re-read, 4 fp32 planes written and summed, tables written
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


def laplacian_costs(B: int, h: int, N: int, M: int, D: int):
    """One call on ``[B, h, N, D]`` x and ``[B, h, M, D]`` y: the forward reads x, y and writes
    the ``N x M`` kernel; the fused backward reads g and out once, writes dx, and dy's partial
    sums when the rows are split (summed, cast). fp32 lane instructions: forward 2 per
    (i, j, d), a difference and an absolute-value add; backward 12 per (i, j, d) for both
    gradients (difference, two compares, their difference, a multiply-add each)."""
    from mmeffattn.ops.laplacian.function import BWD_MAX_D, bwd_row_split

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        bh, nm = B * h, N * M
        fwd = Cost(bh * e * (N * D + M * D + nm), fp32=bh * nm * (2 * D + 2))
        n_d = -(-D // min(BWD_MAX_D, D))
        n_split = -(-N // bwd_row_split(N, n_d * bh))
        glue, launches = 0, 1
        if n_split > 1:  # dy's partial sums written, summed (read, fp32 written)
            glue += 4 * bh * M * D * (2 * n_split + 1)
            launches += 1
        if e < 4:  # dy cast to the input dtype
            glue += bh * M * D * (4 + e)
            launches += 1
        bwd = Cost(bh * e * (2 * nm + 2 * N * D + M * D) + glue, fp32=bh * nm * D * 12,
                   launches=launches)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def newton_schulz_costs(B: int, h: int, M: int, iters: int):
    """One call on ``[B, h, M, M]`` with ``iters`` steps, as the multi-program kernels
    (``MP = padded_size(M) > MAX_REGISTER_MP``) and their glue run.

    Bytes: each launch reads / writes each fp32 ``MP x MP`` matrix it touches once (the
    row-block programs re-read the whole V, P from L2, not counted again). Forward: the input
    padded to fp32 (zero fill + copy), ``fwd_init`` (P read, V_0 written), per step P and V_k
    read and V_k+1 written (kept for the backward), the output cast back. Backward: g and a
    padded again, dP zeroed, per step ``bwd_q`` (V, G read; Q written) and ``bwd`` (P, V, G, Q,
    dP read; G_new, dP written), ``bwd_alpha`` (P, G, dP read; dP written), da cast back.
    Tensor-core FLOPs: 'tf32x3' is three TF32 products per fp32 product, 2 FLOP per MAC, on the
    padded size: 2 MP^3 MACs per forward step, 5 backward. The kernels always compute in fp32,
    so for 16-bit inputs the tensor-core FLOPs are scaled by the ratio of the 16-bit to the
    tf32 peak (``predicted_seconds`` divides 16-bit work by the 16-bit peak). fp32 lane
    instructions: about 3 per element per step."""
    from mmeffattn.ops.newton_schulz.function import padded_size

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        bh, mp = B * h, padded_size(M)
        mat, small = 4 * bh * mp * mp, bh * M * M  # one fp32 padded matrix; elements unpadded
        tc_scale = 1.0 if dtype == 'fp32' else PEAKS['H100']['tc16'] / PEAKS['H100']['tf32']

        def tc(macs: int) -> int:  # tf32x3: three products of 2 FLOP per MAC, per matrix
            return int(3 * 2 * macs * bh * tc_scale)

        pad = mat + small * (e + 4)  # zero fill, copy in
        unpad = small * (4 + e)
        fwd = Cost(pad + 2 * mat + iters * 3 * mat + unpad, fp32=3 * iters * bh * mp * mp,
                   tc=tc(2 * iters * mp ** 3), launches=2 + 1 + iters + 1)
        bwd = Cost(2 * pad + mat + iters * (3 * mat + 7 * mat) + 4 * mat + unpad,
                   fp32=6 * iters * bh * mp * mp, tc=tc(5 * iters * mp ** 3),
                   launches=4 + 1 + 2 * iters + 1 + 1)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def dynamic_dwconv_costs(B: int, C: int, side: int, K: int = DWCONV_KERNEL):
    """One normalized call with static kernel and bias (the GPU check): x, dy, out, dx once
    each through HBM (the shifted re-reads hit L1/L2), the kernel-gradient partial sums written
    and re-read, the per-sample sums summed by torch. fp32 lane instructions: 3 per tap and
    output (multiply, select, add) forward, 5 backward (dx's 3, the dk product and its sum)."""
    from mmeffattn.ops.dynamic_dwconv.function import BWD_TILE, bwd_tiles_per_prog

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        P, KK = side * side, K * K
        bcp = B * C * P
        n_tiles = -(-P // BWD_TILE[1])
        n_cb = -(-C // BWD_TILE[0])
        groups = -(-n_tiles // bwd_tiles_per_prog(n_tiles, n_cb * B))
        small = B * C * KK * e + C * KK * 4 + C * 4  # kernel, static kernel, bias
        fwd = Cost(2 * bcp * e + small, fp32=3 * KK * bcp)
        part = B * groups * C * (KK + 1) * 4
        red = B * C * (KK + 1) * 4
        bwd = Cost(3 * bcp * e + small + 2 * part + 2 * red + B * C * KK * e + C * (KK + 1) * 4,
                   fp32=5 * KK * bcp, launches=4)
        return dict(fwd=fwd, bwd=bwd)
    return costs


def dynamic_weight_costs(B: int, M: int, c_in: int, c_out: int):
    """One call with an fp32 static weight (the GPU check): forward u, v and the weight read,
    the ``[B, c_out, c_in]`` weight written; backward its gradient read (twice: the row-norm
    term, then du and dv), u and v read, du, dv written. Tensor-core FLOPs: 2 per MAC
    (``v^T u`` forward; ``dp``, du, dv backward); fp32 lane instructions: about 3 per output
    weight each way (norm, scale, add)."""
    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        uv = B * M * (c_in + c_out) * e
        w_out = B * c_out * c_in * e
        mac = B * M * c_in * c_out
        fwd = Cost(uv + 4 * c_out * c_in + w_out, fp32=3 * B * c_out * c_in, tc=2 * mac)
        bwd = Cost(2 * w_out + 2 * uv + 8 * B * c_out, fp32=3 * B * c_out * c_in,
                   tc=2 * 2 * mac + 2 * B * c_out * c_in, launches=3)
        return dict(fwd=fwd, bwd=bwd)
    return costs


@dataclass(frozen=True)
class Roofline:
    """An op's analytic roofline at one GPU check's shapes.

    Args:
        costs: ``costs(dtype_name) -> {'fwd': Cost, 'bwd': Cost}`` at those shapes.
        aot_case: a :func:`record` case at those shapes: the launches the launchers really
            issue there (what the kernel report compiles).
    """
    costs: Callable[[str], Dict[str, Cost]]
    aot_case: Dict[str, Any]

    @property
    def op(self) -> str:
        return self.aot_case['op']


def _sema(B, h, side, D):
    return (f'sema B{B}-H{h}-{side}x{side}-D{D}',
            Roofline(sema_costs(B, h, side, D),
                     sema_case(D, SEMA_WINDOW, side, side, 'bf16', return_mean=True, B=B,
                               heads=h)))


def _core_periphery(B, h, C, N, D):
    return (f'core_periphery B{B}-H{h}-C{C}-N{N}-D{D}',
            Roofline(core_periphery_costs(B, h, C, N, D),
                     core_periphery_case(D, C, 'bf16', 'shared', N=N, rope_grad=False, B=B,
                                         heads=h, fused=True)))  # the default backward only


def _laplacian(B, h, N, M, D):
    return (f'laplacian_kernel B{B}-H{h}-N{N}-M{M}-D{D}',
            Roofline(laplacian_costs(B, h, N, M, D), laplacian_case(N, M, D, 'bf16', B=B, H=h)))


def _dynamic_dwconv(B, C, side):
    return (f'dynamic_dwconv B{B}-C{C}-{side}x{side}',
            Roofline(dynamic_dwconv_costs(B, C, side),
                     dynamic_dwconv_case(C, side, side, DWCONV_KERNEL, 'bf16', layout='nchw',
                                         B=B)))


#: GPU check name (``tools/gpu_check.py``) -> its :class:`Roofline`. The Newton-Schulz
#: check at M = 256 runs batched matmuls, not the kernels (M <= 128), so it has none.
ROOFLINES: Dict[str, Roofline] = dict([
    _sema(8, 2, 56, 32), _sema(2, 2, 128, 32),
    _core_periphery(8, 6, 64, 196, 64), _core_periphery(2, 6, 64, 1024, 64),
    _laplacian(8, 1, 3136, 49, 64), _laplacian(2, 1, 16384, 256, 64),
    ('newton_schulz_pinv B8-H1-M49', Roofline(newton_schulz_costs(8, 1, 49, 20),
                                              newton_schulz_case(49, 20, B=8, heads=1))),
    _dynamic_dwconv(8, 768, 14), _dynamic_dwconv(2, 384, 64),
    ('dynamic_weight B8-M49-192x768', Roofline(dynamic_weight_costs(8, 49, 192, 768),
                                               dynamic_weight_case(49, 192, 768, 'bf16',
                                                                   B=8))),
])
