"""2-D rotary position embedding (RoPE) over a token grid, as MLLA/MILA use it.

Adjacent channels ``(2j, 2j+1)`` form a complex number that turns by ``row * theta_j`` for ``j <
C/4`` and by ``col * theta_{j - C/4}`` for the rest, ``theta_k = base ** (-k / (C/4))``. The table
is made for the actual grid and cached; docs/design/sema.md explains the caching.
"""
import functools
from typing import Sequence, Tuple, Union

import torch

from .tokens import is_symbolic

__all__ = ['apply_rope_2d', 'rope_rotation']


def _rope_angles(h: int, w: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """``(cos, sin)`` of every channel pair's angle, ``[h*w, dim // 2, 2]`` float32."""
    k_max = dim // 4
    theta = 1.0 / (base ** (torch.arange(k_max, device=device, dtype=torch.float32) / k_max))
    rows = torch.arange(h, device=device, dtype=torch.float32)
    cols = torch.arange(w, device=device, dtype=torch.float32)
    ang_h = (rows[:, None] * theta).unsqueeze(1).expand(h, w, k_max)  # [h, w, k_max]
    ang_w = (cols[:, None] * theta).unsqueeze(0).expand(h, w, k_max)  # [h, w, k_max]
    angles = torch.cat([ang_h, ang_w], dim=-1).reshape(h * w, 2 * k_max)  # [N, dim/2]
    return torch.stack((angles.cos(), angles.sin()), dim=-1)  # [N, dim/2, 2]


@functools.lru_cache(maxsize=64)
def _rope_angles_cached(h: int, w: int, dim: int, base: float,
                        device: torch.device) -> torch.Tensor:
    # outside inference mode: a table first made under inference_mode can serve training later
    with torch.inference_mode(False), torch.no_grad():
        return _rope_angles(h, w, dim, base, device)


@torch.library.custom_op('mmeffattn::rope_table_2d', mutates_args=())
def _rope_table_op(h: int, w: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    # a copy: the compiled code may reuse an operator's output buffer in place
    return _rope_angles_cached(h, w, dim, base, device).clone()


@_rope_table_op.register_fake
def _rope_table_fake(h: int, w: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    return torch.empty(h * w, dim // 2, 2, device=device)


def rope_rotation(h: int, w: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """The ``(cos, sin)`` table ``[h*w, dim/2, 2]`` for an ``h x w`` grid, cached per size.

    Under ``torch.compile`` it comes from the opaque operator ``mmeffattn::rope_table_2d``, so
    inductor does not recompute the trigonometry in every block; traced or exported graphs compute
    it inline (plain aten, symbolic sizes).
    """
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        return _rope_angles(h, w, dim, base, device)
    if torch.compiler.is_compiling():
        return _rope_table_op(h, w, int(dim), float(base), device)
    if is_symbolic(h, w):
        return _rope_angles(h, w, dim, base, device)
    return _rope_angles_cached(int(h), int(w), int(dim), float(base), device)


def apply_rope_2d(x: Union[torch.Tensor, Sequence[torch.Tensor]], hw: Tuple[int, int],
                  base: float = 10000.) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Rotate ``x [..., N, C]`` (row-major ``hw`` grid, ``C % 4 == 0``) by MLLA's 2-D RoPE, in
    float32 as the official code; the result has ``x``'s dtype. A tuple of same-shape tensors
    (q and k) is rotated with one table and returns a tuple."""
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    H, W = hw
    N, C = xs[0].shape[-2:]
    if N != H * W:
        raise ValueError(f'RoPE got {N} tokens for a {H}x{W} grid')
    if C % 4 != 0:
        raise ValueError(f'2-D RoPE needs channels divisible by 4, got {C}')
    rot = torch.view_as_complex(rope_rotation(H, W, C, base, xs[0].device))  # [N, C/2]

    def rotate(t: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(t.float().unflatten(-1, (C // 2, 2)).contiguous())
        return torch.view_as_real(pairs * rot).flatten(-2).to(t.dtype)  # [..., N, C]

    out = tuple(rotate(t) for t in xs)
    return out if isinstance(x, (tuple, list)) else out[0]
