"""SEMA attention's facts (see :mod:`mmeffattn.ops._opspec`)."""
from typing import Any, List, Sequence

import torch

from .._opspec import Example, OpSpec, as_dtype, randn
from .op import sema_attention, sema_attention_qk, sema_triton_reasons

#: the SEMA backbone's window side
SETTINGS = dict(window=7)


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


def example(device: Any = 'cpu', dtype: Any = torch.float32, B: int = 1, heads: int = 2,
            H: int = 14, W: int = 14, D: int = 32, window: int = SETTINGS['window'],
            layout: str = 'backbone', **_: Any) -> Example:
    """``'backbone'``: the call the SEMA backbone makes, q and k packed in the qk projection's
    ``[B, N, 2 * heads * D]`` output (``sema_attention_qk``), v from the value projection's
    ``[B, N, heads * D]``, the output tokens-major and the mean returned (added back to every
    token here, so that one output carries both); ``'contiguous'``: ``sema_attention`` on
    ``[B, heads, N, D]`` q, k, v."""
    N = H * W
    if layout == 'backbone':
        def fn(backend, qk, v_tok):
            v = v_tok.reshape(B, N, heads, D).transpose(1, 2)
            out, mean = sema_attention_qk(qk.reshape(B, N, 2, heads, D), v, (H, W), window,
                                          out_layout='bnhd', return_mean=True, backend=backend)
            return out.reshape(B, N, heads * D) + mean.reshape(B, 1, heads * D)
        inputs = [randn(B, N, n * heads * D, device=device, dtype=dtype) for n in (2, 1)]
    else:
        def fn(backend, q, k, v):
            return sema_attention(q, k, v, (H, W), window, backend=backend)
        inputs = [randn(B, heads, N, D, device=device, dtype=dtype) for _ in range(3)]
    q = torch.empty(B, heads, N, D, device='meta')
    return Example(fn, inputs, macs(q, q, q, (H, W), window))


def record(D: int = 32, window: int = SETTINGS['window'], H: int = 14, W: int = 14,
           dtype: str = 'fp32', with_mean: bool = True, layout: str = 'backbone',
           return_mean: bool = False, B: int = 1, heads: int = 2) -> None:
    """``'backbone'`` layout: q, k views of a fused qk projection and dq, dk stored into one
    packed gradient (``sema_attention_qk``), v a transposed ``[B, N, heads, D]``, the output
    stored tokens-major; ``return_mean``: the mean returned, as the backbone calls it, and its
    gradient read by the backward. ``'contiguous'``: ``[B, heads, N, D]`` q, k, v."""
    from . import function
    dtype = as_dtype(dtype)
    out_layout, dqk = 'bhnd', None
    if layout == 'backbone':
        qk = torch.empty(B, H * W, 2, heads, D, dtype=dtype)
        q, k = function.qk_views(qk)
        dqk = torch.empty_like(qk)
        v = torch.empty(B, H * W, heads, D, dtype=dtype).transpose(1, 2)
        out_layout = 'bnhd'
    else:
        q, k, v = (torch.empty(B, heads, H * W, D, dtype=dtype) for _ in range(3))
    geom = function.window_geometry((H, W), window)
    scale = D ** -0.5
    o, lse, mean = function.sema_fwd(q, k, v, geom, scale, with_mean,
                                     out_layout=out_layout, return_mean=return_mean)
    function.sema_bwd(torch.empty_like(o), q, k, v, o, lse, mean, geom, scale, with_mean,
                      out_layout=out_layout, dqk=dqk,
                      grad_mean=torch.empty_like(mean) if return_mean else None,
                      return_mean=return_mean)


SPEC = OpSpec(name='sema_attention', macs=macs, can_run=sema_triton_reasons,
              entry_points={'sema_attention_qk': macs_qk}, settings=SETTINGS, example=example,
              record=record,
              gpu_sizes=(dict(B=8, heads=2, H=56, W=56, D=32, return_mean=True),  # SEMA-T
                         dict(B=2, heads=2, H=128, W=128, D=32, return_mean=True)))
