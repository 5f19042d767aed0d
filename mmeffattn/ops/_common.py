"""Helpers the ops share (PyTorch only: this module imports without Triton).

The Triton side of the shared code (``@triton.jit`` helpers, the softmax-backward delta
pre-pass) is :mod:`mmeffattn.ops._common_kernels`; launch plumbing is :mod:`mmeffattn.ops._launch`.
An op uses these instead of another op's private modules.
"""
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
    """Whether a size is symbolic (a ``torch.SymInt``: torch.export or torch.compile with a
    dynamic shape). A Python branch or ``int()`` on such a size pins it in the graph, so the
    references then take the branch-free path (e.g. a zero pad that is a no-op)."""
    return any(isinstance(s, torch.SymInt) for s in sizes)


# ---------------------------------------------------------------------------------------------
# numerics shared by the references
# ---------------------------------------------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an op computes in: fp32 for 16-bit floats (an fp16 sum of ``D`` distances or a
    Newton-Schulz product loses the result), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` over the last two dims, written plainly (the references):
    ``mask`` (broadcast to the logits, True = real key) gives the other keys zero weight.
    Computed in fp32 for 16-bit inputs; returns v's dtype."""
    ct = compute_dtype(q.dtype)
    logits = (q.to(ct) @ k.to(ct).transpose(-1, -2)) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask, float('-inf'))
    return (torch.softmax(logits, dim=-1) @ v.to(ct)).to(v.dtype)


def window_attention(q_w: torch.Tensor, k_w: torch.Tensor, v_w: torch.Tensor,
                     mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """Softmax attention inside each window, the torch backend's form: ``[BH, nW, L, D]`` ->
    ``[BH, nW, L, D]`` (any leading dims; a dense attention is one window). ``mask`` (``[nW, 1,
    L]`` bool, True = real key) excludes padded keys.

    fp32 with at least :data:`FUSED_MIN_KEYS` keys runs torch's fused
    ``scaled_dot_product_attention`` (except masked windows that need a gradient); everything
    else a matmul and softmax (softmax in fp32 for 16-bit inputs, the logits too for fp16). Both
    keep the NaN contract, except that the fused kernel gives a finite row where every logit is
    -inf. Measurements and the NaN findings behind the rule: docs/design/ops_backends.md.
    """
    fused = q_w.dtype == torch.float32 and k_w.shape[-2] >= FUSED_MIN_KEYS
    if fused and mask is not None:
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q_w, k_w, v_w)):
            fused = False  # a masked fused backward is slower than the plain form's
        else:
            # the fused CPU kernel takes a mask of q's rank only (else its slow math fallback)
            mask = mask.view((1,) * (q_w.dim() - mask.dim()) + tuple(mask.shape))
    if fused:
        return F.scaled_dot_product_attention(q_w, k_w, v_w, attn_mask=mask, scale=scale)
    if q_w.dtype == torch.float16:  # fp16 logits overflow past 65504 (the kernels' are fp32)
        q_w, k_w = q_w.float(), k_w.float()
    logits = (q_w * scale) @ k_w.transpose(-1, -2)  # [BH, nW, L, L]
    if mask is not None:
        logits = logits.masked_fill(~mask, float('-inf'))
    return torch.softmax(logits, dim=-1, dtype=compute_dtype(q_w.dtype)).to(v_w.dtype) @ v_w


def is_eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether the caller runs eagerly on tensors with values: not inside a graph being captured
    (``torch.compile``, ``torch.export`` and the ONNX exporter, ``torch.jit.trace``), not under
    a ``FakeTensorMode``, and none of ``tensors`` (the ones a check would read; None entries are
    skipped) is a fake tensor or on the meta device. Checks that read a tensor's values (the
    references' non-finite guards, ``newton_schulz_pinv``'s convergence check) run only eagerly:
    a graph cannot branch on a value, and fake and meta tensors have none (reading one raises)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return False  # (real tensors met under the mode become fake ones)
    return not any(t is not None and (t.device.type == 'meta' or is_fake(t)) for t in tensors)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``; False for a device type autocast does not
    know (e.g. meta, for which ``torch.is_autocast_enabled`` raises)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A context with autocast off for ``device_type``, for code that computes in the dtypes it
    chooses whatever autocast its caller runs under (an op documented to return its inputs'
    dtype, as the Triton kernels do). Enters nothing unless autocast is on there, so a graph
    captured without autocast is unchanged."""
    return (torch.autocast(device_type, enabled=False) if autocast_enabled(device_type)
            else contextlib.nullcontext())


#: the fewest keys for which :func:`window_attention` uses torch's fused attention: AVX-512's 16
#: fp32 lanes, so that the NaN contract holds on every x86 CPU
FUSED_MIN_KEYS = 16


# ---------------------------------------------------------------------------------------------
# strides and int32 offsets (launchers and ``can_run`` reasons)
# ---------------------------------------------------------------------------------------------
def bh_strides(x: torch.Tensor) -> Tuple[int, int, int]:
    """``(batch, head, token)`` strides of a ``[B, heads, N, D]`` tensor (D has unit stride)."""
    return x.stride(0), x.stride(1), x.stride(2)


def strides4(x: torch.Tensor) -> Tuple[int, int, int, int]:
    """All four strides of a 4-D tensor (e.g. ``[B, C, H, W]`` in any memory layout)."""
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)


def token_offsets_fit(*tensors: torch.Tensor) -> bool:
    """Whether the offsets inside one (batch, head) slice of these ``[B, heads, N, D]`` tensors
    fit the kernels' int32 token arithmetic (batch and head offsets are int64)."""
    return all((x.shape[2] - 1) * abs(x.stride(2)) + x.shape[3] < INT32_LIMIT for x in tensors)


def sample_offsets_fit(*tensors: torch.Tensor) -> bool:
    """Whether the offsets inside one sample (every dim but the first) of these tensors fit the
    kernels' int32 arithmetic (the sample offset is int64)."""
    return all(sum((s - 1) * abs(st) for s, st in zip(x.shape[1:], x.stride()[1:])) < INT32_LIMIT
               for x in tensors)


def check_token_offsets(*tensors: torch.Tensor) -> None:
    """Raise ValueError when :func:`token_offsets_fit` fails (the launchers' last guard)."""
    if not token_offsets_fit(*tensors):
        raise ValueError('a [B, heads, N, D] tensor overflows the kernels\' int32 token offsets '
                         '(N * token stride >= 2**31); use the reference backend')


def offsets_reason(fits: Optional[bool], what: str) -> List[str]:
    """``[reason]`` when an int32-offset check failed (``fits`` is False), else ``[]``; None
    (the kernels did not import, so nothing was checked) gives no reason."""
    if fits is None or fits:
        return []
    return [f'{what} (the kernels\' offsets are int32)']


# ---------------------------------------------------------------------------------------------
# the kernel-import guard of every op.py
# ---------------------------------------------------------------------------------------------
def import_kernels(package: str, *names: str, module: str = 'function') -> Tuple[Any, ...]:
    """``(*objects, import_error)``: ``names`` from ``<package>.<module>`` when Triton is
    installed and the module imports, else Nones and the error ('' when Triton is absent: its
    own reason is given by ``can_run_triton``). ``op.py`` calls it once at import, with
    ``module='library'``: the Triton entry point that calls the op's registered custom operator
    (``mmeffattn/ops/_library.py``)."""
    if not HAS_TRITON:
        return (None, ) * len(names) + ('', )
    try:
        module = importlib.import_module(f'{package}.{module}')
    except Exception as e:  # pragma: no cover - e.g. a Triton release without an API we use
        return (None, ) * len(names) + (f'{type(e).__name__}: {e}', )
    return tuple(getattr(module, n) for n in names) + ('', )

