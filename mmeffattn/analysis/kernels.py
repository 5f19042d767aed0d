"""The Triton launches and analytic costs of each op, for tools and tests that look at compiled
kernels without running them: :func:`record` (the launches of one case), :func:`specialise` and
:func:`compile_launch` (an NVIDIA compile without a GPU), and :data:`ROOFLINES` (per GPU check,
the bytes and work of one call and its predicted time at peak rates).
"""
import inspect
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, NamedTuple, Optional

from mmeffattn.ops._launch import record_launches
from mmeffattn.ops._spec import DTYPES, SPECS, get_spec
from mmeffattn.ops.dynamic_dwconv.spec import SETTINGS as DWCONV_SETTINGS
from mmeffattn.ops.sema.spec import SETTINGS as SEMA_SETTINGS, window_sides


class Cost(NamedTuple):
    """What one pass of an op moves and computes on a GPU, kernels and glue together: HBM
    ``bytes``, ``fp32`` CUDA-core lane instructions (an FFMA counts 1), tensor-core FLOPs ``tc``
    (2 per MAC) and ``launches``."""
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
    """The roofline time of ``cost`` on ``gpu``: the larger of the HBM time and the compute time
    (CUDA-core and tensor-core work added: they share issue slots), no launch latency."""
    peak = PEAKS[gpu]
    tc_peak = peak['tf32'] if dtype == 'fp32' else peak['tc16']
    return max(cost.bytes / peak['hbm'], cost.fp32 / peak['fp32'] + cost.tc / tc_peak)


def total_cost(costs: Dict[str, Cost]) -> Cost:
    """The fields of ``costs`` (e.g. forward and backward) summed."""
    return Cost(*(sum(getattr(c, f) for c in costs.values()) for f in Cost._fields))


# -- recorded launches --
def case(op: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """A case of op ``op``: ``dict(op=op, ...)`` with the arguments of its ``spec.record``
    (positional ones named; JSON-serialisable, for a compile worker)."""
    bound = inspect.signature(get_spec(op).record).bind(*args, **kwargs)
    return dict(op=op, **bound.arguments)


def case_name(op: str, sizes: Dict[str, Any]) -> str:
    """``'<op> B8-heads2-...'``: the op and its integer sizes, e.g. a GPU check's name."""
    return f'{op} ' + '-'.join(f'{k}{v}' for k, v in sizes.items() if type(v) is int)


def record(case: Dict[str, Any]) -> list:
    """The launches of one forward + backward of ``case['op']`` at the case's sizes, recorded
    on empty CPU tensors (nothing runs)."""
    with record_launches() as launches:
        get_spec(case['op']).record(**{k: v for k, v in case.items() if k != 'op'})
    return launches


def specialise(launch, arch: int):
    """(target, signature, constexprs, attrs, options) as Triton's JIT derives them from the
    launch's arguments (Triton internals: an upgrade that changes them fails loudly)."""
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


# -- rooflines: costs(dtype) -> {'fwd': Cost, 'bwd': Cost} of one call --
def sema_costs(B: int, heads: int, H: int, W: int, D: int,
               window: int = SEMA_SETTINGS['window'], **_: Any):
    """One call on ``[B, heads, H * W, D]`` q, k, v in windows of ``window``, as the SEMA
    backbone makes it (q, k packed, output tokens-major, the mean returned). Forward: q, k, v
    read, o written, fp32 block value sums reduced into the mean (with several blocks per
    window, also the log-sum-exp). Backward: the delta pre-pass (several blocks only), then
    q, k, v, dO and the mean's gradient read, dq, dk, dv written. A 49-token window is one
    block in 16-bit dtypes, four in fp32. Tensor-core products: two forward, five backward;
    fp32 lane instructions: about 4 per score forward, 6 backward."""
    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        h, N = heads, H * W
        t = B * h * N * D * e  # one [B, h, N, D] tensor
        row = 4 * B * h * N  # one fp32 value per token (lse, delta)
        sides_h, sides_w = window_sides(H, window), window_sides(W, window)
        pairs = B * h * sum((a * b) ** 2 for a in sides_h for b in sides_w)
        tokens = min(window, H) * min(window, W)
        several = dtype == 'fp32' or tokens > 64
        assert dtype == 'fp32' or not several, 'a 16-bit window over 64 tokens: not modelled'
        n_parts = len(sides_h) * len(sides_w) * (-(-tokens // 16) if several else 1)
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


def core_periphery_costs(B: int, heads: int, C: int, N: int, D: int, rope_grad: bool = False,
                         fused: Optional[bool] = None, **_: Any):
    """One call on ``[B, h, C + N, D]`` q, k, v with rope tables ``[1, C + N, D]`` shared by the
    batch (``rope_grad``: the tables need gradients too), as the kernels and their glue run.

    Bytes: each launch reads each row it needs once (re-reads come from L2) and the tables once.
    Forward: the patch launch (q, core k/v read; o, lse written) and the core launch (core q,
    all k/v read), whose split key loops write fp32 partials merged in PyTorch. Backward: the
    delta pre-pass, then per side a dq and a dk/dv launch, split as the launchers split them;
    ``fused`` (None: where the launchers fuse) visits each pair once in three launches with an
    fp32 ``[3, B*h, C, D]`` buffer (its L2 atomics are not HBM bytes). ``rope_grad`` adds the
    q/k re-reads and the fp32 table partials. Tensor-core FLOPs: 2 per MAC, two products per
    pair forward; backward S and dP per visit plus dV, dQ, dK once. fp32 lane instructions:
    about 4 per score forward, 3 per score and visit backward, 3 per rotated element loaded."""
    from mmeffattn.ops.core_periphery.function import (core_periphery_bwd_tiles,
                                                       core_periphery_tiles, padded_head_dim)

    def costs(dtype: str) -> Dict[str, Cost]:
        torch_dtype = DTYPES[dtype]
        e = torch_dtype.itemsize
        L, bh = C + N, B * heads
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


def laplacian_costs(B: int, heads: int, N: int, M: int, D: int, **_: Any):
    """One call on ``[B, h, N, D]`` x and ``[B, h, M, D]`` y: forward x, y read, the kernel
    written; the fused backward reads g and out once, writes dx and dy (partial sums when the
    rows are split). fp32 lane instructions per (i, j, d): 2 forward, 12 backward."""
    from mmeffattn.ops.laplacian.function import BWD_MAX_D, bwd_row_split

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        bh, nm = B * heads, N * M
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


def newton_schulz_costs(B: int, heads: int, M: int, iters: int, **_: Any):
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
        bh, mp = B * heads, padded_size(M)
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


def dynamic_dwconv_costs(B: int, C: int, H: int, W: int,
                         K: int = DWCONV_SETTINGS['kernel_size'], **_: Any):
    """One normalized call with static kernel and bias: x, dy, out, dx once each through HBM
    (shifted re-reads hit L1/L2), the kernel-gradient partial sums written and re-read. fp32
    lane instructions per tap and output: 3 forward, 5 backward."""
    from mmeffattn.ops.dynamic_dwconv.function import BWD_TILE, bwd_tiles_per_prog

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        P, KK = H * W, K * K
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


def dynamic_weight_costs(B: int, M: int, C_in: int, C_out: int, **_: Any):
    """One call with an fp32 static weight: forward u, v, the weight read, ``[B, c_out, c_in]``
    written; backward its gradient read twice, u, v read, du, dv written. Tensor-core FLOPs: 2
    per MAC; fp32 lane instructions: about 3 per output weight each way."""
    def costs(dtype: str) -> Dict[str, Cost]:
        c_in, c_out = C_in, C_out
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
    """An op's analytic roofline at one GPU check's shapes: ``costs(dtype_name) -> {'fwd':
    Cost, 'bwd': Cost}`` and the :func:`record` case the kernel report compiles."""
    costs: Callable[[str], Dict[str, Cost]]
    aot_case: Dict[str, Any]

    @property
    def op(self) -> str:
        return self.aot_case['op']


#: each op's cost model, ``costs(**sizes)``, the sizes of its ``spec.gpu_sizes``
COSTS: Dict[str, Callable[..., Callable[[str], Dict[str, Cost]]]] = {
    'sema_attention': sema_costs, 'core_periphery_attention': core_periphery_costs,
    'laplacian_kernel': laplacian_costs, 'newton_schulz_pinv': newton_schulz_costs,
    'dynamic_dwconv': dynamic_dwconv_costs, 'dynamic_weight': dynamic_weight_costs}
#: GPU check name (:func:`case_name` of each op's ``spec.gpu_sizes``) -> its :class:`Roofline`
ROOFLINES: Dict[str, Roofline] = {
    case_name(spec.name, sizes): Roofline(COSTS[spec.name](**sizes),
                                          dict(op=spec.name, dtype='bf16', **sizes))
    for spec in SPECS for sizes in spec.gpu_sizes}
