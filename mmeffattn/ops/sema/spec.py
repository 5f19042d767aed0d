"""SEMA attention's declarations for the cross-op tools (see :mod:`mmeffattn.ops._spec`)."""
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .._spec import DTYPES, AotSpec, Cost, OpSpec, Roofline, randn, square_grid
from .op import sema_attention, sema_attention_qk, sema_triton_reasons

#: the backbone's window side (benchmarks, GPU checks)
WINDOW = 7


def window_sides(n: int, window: int) -> List[int]:
    """Sides of the windows tiled from the start of a grid side ``n`` (the last may be short);
    a side smaller than the window is one window of that side."""
    w = min(window, n)
    return [w] * (n // w) + ([n % w] if n % w else [])


def macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Sequence[int],
         window_size: int, **kwargs: Any) -> int:
    """Softmax attention among the real tokens of each window (padded keys are no work of the
    op; the reference computes them, the kernels mask them) plus the mean of the values."""
    B, nh, N, D = q.shape
    H, W = hw
    pairs = sum((a * b) ** 2 for a in window_sides(H, window_size)
                for b in window_sides(W, window_size))  # sum over windows of L_w^2
    return B * nh * pairs * 2 * D + B * nh * N * D * int(kwargs.get('with_mean', True))


def macs_qk(qk: torch.Tensor, v: torch.Tensor, hw: Sequence[int], window_size: int,
            **kwargs: Any) -> int:
    """:func:`macs` of ``sema_attention_qk`` (q, k packed in ``qk``; v has q's shape)."""
    return macs(v, v, v, hw, window_size, **kwargs)


def benchmark(n: int, s: Any, device: torch.device, dtype: torch.dtype):
    """``[B, heads, N, D]`` q, k, v on a square grid, windows of :data:`WINDOW`."""
    hw = square_grid(n)
    q, k, v = (torch.randn(s.batch, s.heads, hw[0] * hw[1], s.head_dim, device=device,
                           dtype=dtype) for _ in range(3))
    return (lambda b: sema_attention(q, k, v, hw, WINDOW, backend=b),
            macs(q, k, v, hw, WINDOW), 4 * q.numel() * q.element_size(),
            dict(N=hw[0] * hw[1], grid=list(hw), tokens=hw[0] * hw[1]))


def gpu_check(B: int, h: int, side: int, D: int):
    """The call as the SEMA backbone makes it (what the roofline models): q, k packed, a view
    of a fused qk projection ``[B, N, 2 * h * D]`` (``sema_attention_qk``), v of a value
    projection ``[B, N, h * D]``, the output tokens-major ``[B, N, h * D]``, the mean returned.
    The check adds the mean to every token itself, so that both outputs and their gradients
    are checked; its timing includes that add and its token-sum gradient, what the backbone
    does with several images (with one, the LePE's bias does it at no cost), which the op's
    roofline leaves to the caller."""
    N = side * side

    def call(b, qk, v_tok):
        v = v_tok.reshape(B, N, h, D).transpose(1, 2)
        out, mean = sema_attention_qk(qk.reshape(B, N, 2, h, D), v, (side, side), WINDOW,
                                      out_layout='bnhd', return_mean=True, backend=b)
        return out.reshape(B, N, h * D) + mean.reshape(B, 1, h * D)

    def make(device, dtype):
        return call, [randn(B, N, 2 * h * D, device=device, dtype=dtype),
                      randn(B, N, h * D, device=device, dtype=dtype)]
    return make


def implied_weights(q: torch.Tensor, k: torch.Tensor, hw: Tuple[int, int],
                    rows: torch.Tensor, window: int = WINDOW, **_: Any) -> torch.Tensor:
    """``out_i = sum_j a_ij v_j + mean_j v_j`` weighs ``v_j`` by ``a_ij + 1/N`` (total 2),
    halved to a distribution."""
    from mmeffattn.analysis.dispersion import window_weights
    return (window_weights(q, k, hw, rows, window) + 1.0 / q.shape[2]) / 2


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation
# ---------------------------------------------------------------------------------------------
def aot_case(D, window, H, W, dtype, with_mean=True, layout='backbone',
             return_mean=False) -> Dict[str, Any]:
    return dict(op='sema_attention', D=D, window=window, H=H, W=W, dtype=dtype,
                with_mean=with_mean, layout=layout, return_mean=return_mean)


def aot_record(case: Dict[str, Any]) -> list:
    """The launches of one forward + backward, as the launchers issue them (``'backbone'``
    layout: q, k views of a fused qk projection and dq, dk stored into one packed gradient
    (``sema_attention_qk``), v a transposed ``[B, N, heads, D]``, the output stored
    tokens-major, ``out_layout='bnhd'``; ``return_mean``: the mean returned, as the backbone
    calls it, and its gradient, in v's dtype, read by the backward)."""
    from . import function
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
    else:  # 'contiguous' [B, heads, N, D]
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


# Only the tile class changes the compiled code: dtype, padded head dim BD, whether D == BD,
# one block per window or several, the block size, the mean added, returned (the forward
# writes partial sums, the backward reads the mean's gradient in v's dtype) or absent (plus
# Triton's alignment specialisation of pointers and strides). Window token counts 12, 30, 49
# and 144 hit every block class (16, 32, 64 tokens in one block; several blocks), so the full
# list compiles every tile class there is; the subset is the backbone's head dim 32 with window
# 7 in every dtype (the mean returned, as the backbone calls it) plus one case of each other
# kind of tile, in both mean modes.
_MEAN_MODES = dict(add=dict(with_mean=True), ret=dict(with_mean=True, return_mean=True),
                   none=dict(with_mean=False))
AOT = AotSpec(
    record=aot_record,
    subset=[aot_case(32, 7, 14, 14, 'fp16', return_mean=True),
            aot_case(32, 7, 14, 14, 'bf16', return_mean=True),
            aot_case(32, 7, 14, 14, 'fp32', return_mean=True),
            aot_case(32, 7, 14, 14, 'bf16'),
            aot_case(128, 7, 14, 14, 'bf16', return_mean=True),
            aot_case(128, 7, 14, 14, 'fp32'), aot_case(40, 12, 24, 24, 'fp16', with_mean=False),
            aot_case(128, 12, 24, 24, 'bf16'),
            aot_case(128, 12, 24, 24, 'bf16', return_mean=True),
            aot_case(64, 12, 24, 24, 'fp32', return_mean=True),
            aot_case(72, 7, 3, 4, 'fp16'), aot_case(24, 7, 5, 6, 'fp32')],
    full=[aot_case(D, window, H, W, dtype, layout=layout, **mode)
          for D in (16, 24, 32, 40, 64, 72, 128)  # each BD in {16, 32, 64, 128}, D == BD or not
          for dtype in ('fp16', 'bf16', 'fp32')
          for window, H, W in ((7, 3, 4), (7, 5, 6), (7, 14, 14), (12, 24, 24))
          for mode in _MEAN_MODES.values()
          for layout in ('backbone', 'contiguous')],
    kernels=frozenset({'sema_fwd_window_kernel', 'sema_bwd_window_kernel', 'sema_fwd_kernel',
                       'sema_bwd_kernel', 'softmax_bwd_delta_kernel'}))

DESIGNS = ('return_mean', 'mean_inside', 'before')


def roofline_costs(B: int, h: int, side: int, D: int, design: str = 'return_mean'):
    """``costs(dtype) -> {'fwd': Cost, 'bwd': Cost}`` of one call on ``[B, h, side**2, D]``
    q, k, v in windows of :data:`WINDOW`, with the glue around it as the SEMA backbone calls it
    (q, k packed in the qk projection's output, ``sema_attention_qk``; the output read
    tokens-major by the next projection), in one of three designs:

    ``'return_mean'`` (now, issue 14 fix 4): the op returns the mean and the backbone adds it
    through the LePE convolution's bias. Forward: the kernel (reads q, k, v, stores o straight
    into ``[B, N, heads, D]``; with several blocks per window, the fp32 log-sum-exp) also
    writes each block's fp32 value sum (a program of the several-block kernel reads its own
    block's v rows once more, which its loop reads again: one HBM read of v between them), one
    sum of those ``n_win * n_blocks`` rows per (batch, head) into the mean, and in 16-bit dtypes
    its cast to v's dtype; no pass over v. Backward: the delta pre-pass with several blocks (o,
    dO; delta written), the kernel (q, k, v, dO and the mean's gradient read; lse and delta
    with several blocks; dq, dk written straight into the projection's packed gradient, dv in
    v's layout); no ``sum_n dO`` (the mean's gradient arrives as the conv's bias gradient).
    ``'mean_inside'`` (the previous round): the kernels add the mean; forward a value-mean pass
    before the kernel (reads v), backward a ``sum_n dO`` pass (reads dO).
    ``'before'`` (before issue 14): ``'mean_inside'`` plus the output's transpose copy forward,
    and backward a ``div_``, zero-filled gradients for lse and mean, the reshape copies of the
    dq/dk and dv gradients, and autograd's stack of dq, dk into the projection's gradient
    (q and k passed unbound to ``sema_attention``).

    A window of 49 tokens is one block in 16-bit dtypes (one-block kernels: no lse, no delta,
    no pre-pass) and four 16-token blocks in fp32. Tensor-core FLOPs: 2 per MAC, two
    products forward, five backward (S recomputed, dP, dV, dQ, dK); fp32 lane instructions:
    about 4 per score forward (scale, max, exp, sum) and 6 backward."""
    if design not in DESIGNS:
        raise ValueError(f'design must be one of {DESIGNS}, got {design!r}')

    def costs(dtype: str) -> Dict[str, Cost]:
        e = DTYPES[dtype].itemsize
        N = side * side
        t = B * h * N * D * e  # one [B, h, N, D] tensor
        row = 4 * B * h * N  # one fp32 value per token (lse, delta)
        pairs = B * h * sum((a * b) ** 2 for a in window_sides(side, WINDOW)
                            for b in window_sides(side, WINDOW))
        tokens = min(WINDOW, side) ** 2
        several = dtype == 'fp32' or tokens > 64
        assert dtype == 'fp32' or not several, 'a 16-bit window over 64 tokens: not modelled'
        n_parts = len(window_sides(side, WINDOW)) ** 2 * (-(-tokens // 16) if several else 1)
        fwd_bytes = 4 * t + (row if several else 0)  # kernel
        bwd_bytes = 7 * t + (2 * t + 3 * row if several else 0)  # kernel; pre-pass
        fwd_launches, bwd_launches = 1, 1 + int(several)
        if design == 'return_mean':
            cast = dtype != 'fp32'
            # the partial sums written and read; the mean written (and cast)
            fwd_bytes += 2 * 4 * B * h * n_parts * D + 4 * B * h * D + (
                (4 + e) * B * h * D if cast else 0)
            fwd_launches += 1 + int(cast)
            bwd_bytes += B * h * D * e  # the mean's gradient
        else:
            fwd_bytes += t  # the value-mean pass
            bwd_bytes += t  # the dO sum
            fwd_launches += 1
            bwd_launches += 1
        if design == 'before':
            fwd_bytes += 2 * t  # the output's transpose copy
            fwd_launches += 1
            # dq, dk stacked (read 2t, write 2t); dv and dqk reshape copies; zero-filled lse
            # gradient
            bwd_bytes += 4 * t + 2 * t + 4 * t + (row if several else 0)
            bwd_launches += 5 + int(several)  # + stack, div_ and the mean's zero gradient
        return dict(fwd=Cost(fwd_bytes, fp32=4 * pairs, tc=2 * 2 * pairs * D,
                             launches=fwd_launches),
                    bwd=Cost(bwd_bytes, fp32=6 * pairs, tc=5 * 2 * pairs * D,
                             launches=bwd_launches))
    return costs


def roofline(B: int, h: int, side: int, D: int) -> Roofline:
    return Roofline(check=f'sema B{B}-H{h}-{side}x{side}-D{D}',
                    costs=roofline_costs(B, h, side, D),
                    aot_case=dict(aot_case(D, WINDOW, side, side, 'bf16', return_mean=True),
                                  B=B, heads=h),
                    previous=roofline_costs(B, h, side, D, design='before'))


SPEC = OpSpec(
    name='sema_attention', macs=macs, can_run=sema_triton_reasons,
    # SEMA-T stage 1 at 224 (batch 8) and 512
    gpu_checks=[('sema B8-H2-56x56-D32', gpu_check(8, 2, 56, 32)),
                ('sema B2-H2-128x128-D32', gpu_check(2, 2, 128, 32))],
    benchmarks={'sema': benchmark}, benchmark_settings=dict(window=WINDOW),
    attention_kinds={'sema': implied_weights}, aot=AOT,
    rooflines=[roofline(8, 2, 56, 32), roofline(2, 2, 128, 32)],
    entry_points={'sema_attention_qk': macs_qk})
