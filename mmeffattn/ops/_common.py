"""PyTorch helpers the ops share (imports without Triton; the Triton side is
:mod:`._common_kernels`, launch plumbing :mod:`._launch`)."""
import contextlib
import importlib
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from ._backend import HAS_TRITON

#: the kernels' in-slice offsets are int32: a slice must span fewer elements than this
INT32_LIMIT = 2 ** 31


def is_symbolic(*sizes: Any) -> bool:
    """Whether a size is a ``torch.SymInt`` (a branch on it would pin it in the graph)."""
    return any(isinstance(s, torch.SymInt) for s in sizes)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an op computes in: fp32 for 16-bit floats, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` written plainly (``mask``: True = real key), in fp32 for
    16-bit inputs; returns v's dtype."""
    ct = compute_dtype(q.dtype)
    logits = (q.to(ct) @ k.to(ct).transpose(-1, -2)) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask, float('-inf'))
    return (torch.softmax(logits, dim=-1) @ v.to(ct)).to(v.dtype)


def window_attention(q_w: torch.Tensor, k_w: torch.Tensor, v_w: torch.Tensor,
                     mask: Optional[torch.Tensor], scale: float,
                     fused_bf16: bool = False) -> torch.Tensor:
    """Softmax attention per window, the torch backend's form: ``[BH, nW, L, D]`` in and out
    (``mask`` ``[nW, 1, L]``, True = real key). fp32 with at least :data:`FUSED_MIN_KEYS` keys
    uses torch's fused SDPA, else matmul and softmax (why: docs/design/ops_backends.md);
    ``fused_bf16``: bf16 without a gradient too.
    """
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q_w, k_w, v_w))
    fused = (q_w.dtype == torch.float32 or fused_bf16 and q_w.dtype == torch.bfloat16
             and not grad) and k_w.shape[-2] >= FUSED_MIN_KEYS
    if fused and mask is not None:
        if grad:
            fused = False  # a masked fused backward is slower than the plain form's
        else:
            # the fused CPU kernel takes a mask of q's rank only
            mask = mask.view((1,) * (q_w.dim() - mask.dim()) + tuple(mask.shape))
    if fused:
        return F.scaled_dot_product_attention(q_w, k_w, v_w, attn_mask=mask, scale=scale)
    if q_w.dtype == torch.float16:  # fp16 logits overflow past 65504 (the kernels' are fp32)
        q_w, k_w = q_w.float(), k_w.float()
    logits = (q_w * scale) @ k_w.transpose(-1, -2)  # [BH, nW, L, L]
    if mask is not None:
        logits = logits.masked_fill(~mask, float('-inf'))
    # (a bf16 softmax sums in fp32 and rounds once, without an fp32 copy of the logits)
    return torch.softmax(logits, dim=-1).to(v_w.dtype) @ v_w


def is_eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether the caller runs eagerly on tensors with values (not captured, traced, fake or
    meta): checks that read values run only then."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return False  # (real tensors met under the mode become fake ones)
    return not any(t is not None and (t.device.type == 'meta' or is_fake(t)) for t in tensors)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False where autocast is unavailable)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off for ``device_type``; a null context unless autocast is on (graphs
    captured without autocast stay unchanged)."""
    return (torch.autocast(device_type, enabled=False) if autocast_enabled(device_type)
            else contextlib.nullcontext())


#: fewest keys for fused attention (AVX-512's 16 fp32 lanes: below, it can drop a NaN)
FUSED_MIN_KEYS = 16


def bh_strides(x: torch.Tensor) -> Tuple[int, int, int]:
    """``(batch, head, token)`` strides of a ``[B, heads, N, D]`` tensor (D has unit stride)."""
    return x.stride(0), x.stride(1), x.stride(2)


def token_offsets_fit(*tensors: torch.Tensor) -> bool:
    """Whether offsets inside one (batch, head) slice of ``[B, heads, N, D]`` fit int32."""
    return all((x.shape[2] - 1) * abs(x.stride(2)) + x.shape[3] < INT32_LIMIT for x in tensors)


def sample_offsets_fit(*tensors: torch.Tensor) -> bool:
    """Whether offsets inside one sample (every dim but the first) fit int32."""
    return all(sum((s - 1) * abs(st) for s, st in zip(x.shape[1:], x.stride()[1:])) < INT32_LIMIT
               for x in tensors)


def check_token_offsets(*tensors: torch.Tensor) -> None:
    """Raise ValueError when :func:`token_offsets_fit` fails (the launchers' last guard)."""
    if not token_offsets_fit(*tensors):
        raise ValueError('a [B, heads, N, D] tensor overflows the kernels\' int32 token offsets '
                         '(N * token stride >= 2**31); use the reference backend')


def offsets_reason(fits: Optional[bool], what: str) -> List[str]:
    """``[reason]`` when ``fits`` is False; None (nothing checked) gives none."""
    if fits is None or fits:
        return []
    return [f'{what} (the kernels\' offsets are int32)']


def import_kernels(package: str, *names: str, module: str = 'function') -> Tuple[Any, ...]:
    """``(*objects, import_error)``: ``names`` from ``<package>.<module>``, or Nones and the
    error ('' when Triton is absent: ``triton_reasons`` says so)."""
    if not HAS_TRITON:
        return (None, ) * len(names) + ('', )
    try:
        module = importlib.import_module(f'{package}.{module}')
    except Exception as e:  # pragma: no cover - e.g. a Triton release without an API we use
        return (None, ) * len(names) + (f'{type(e).__name__}: {e}', )
    return tuple(getattr(module, n) for n in names) + ('', )

