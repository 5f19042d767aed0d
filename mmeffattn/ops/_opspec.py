"""The facts an op declares about itself (:class:`OpSpec`, one per ``<op>/spec.py``, listed
in :mod:`._spec`): its MACs, where its kernels run, its tolerances, the backbones' settings and
the calls and kernel launches at given sizes that the GPU check, the benchmarks, the kernel
report and the tests run."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import torch

#: dtype names used by test ids and reports
DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}


def as_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    """A torch dtype from itself or its :data:`DTYPES` name."""
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def randn(*shape: int, device: Any = 'cpu', dtype: Union[str, torch.dtype] = torch.float32,
          scale: float = 1.0) -> torch.Tensor:
    """Standard normal times ``scale``, drawn in fp32 and cast: one seed, one set of values in
    every dtype."""
    return (torch.randn(*shape, device=device) * scale).to(as_dtype(dtype))


class Example(NamedTuple):
    """One call of an op: ``fn(backend, *inputs)`` calls the public op on ``inputs`` (the
    tensors it differentiates, in the layouts the backbone passes them) with its other
    arguments fixed; ``macs``: the call's analytic MACs."""
    fn: Callable[..., Any]
    inputs: List[torch.Tensor]
    macs: int


class Tolerance(NamedTuple):
    """Relative RMS error with an absolute floor, and the slack of the element-wise check."""
    rtol: float
    atol: float
    max_factor: float


#: per dtype, against the fp64 reference: ``rms(err) <= rtol rms(expected) + atol`` and
#: ``max|err| <= max_factor (rtol max|expected| + atol)``
DEFAULT_TOLERANCES: Dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-10, 1e-12, 10.),
    torch.float32: Tolerance(1e-5, 1e-7, 20.),
    torch.float16: Tolerance(2e-3, 1e-5, 20.),
    torch.bfloat16: Tolerance(1.6e-2, 1e-4, 20.),
}


@dataclass(frozen=True)
class OpSpec:
    """One op's facts.

    Args:
        name: the public op, an attribute of :mod:`mmeffattn.ops` (e.g. ``'sema_attention'``).
        macs: analytic multiply-accumulates of one call, from the op's own arguments.
        can_run: the op's ``*_triton_reasons(*tensors, ...)`` (``[]``: the kernels can run).
        tolerances: per-dtype :class:`Tolerance` of the kernels against the fp64 reference.
        entry_points: the op's other public functions (e.g. ``sema_attention_qk``, inputs
            packed differently) -> their analytic MACs from their own arguments.
        settings: the backbones' settings of the op (e.g. SEMA's window), the default of the
            calls below.
        example: ``example(device, dtype, **sizes) -> Example``: the op called on random
            inputs of those sizes, as its backbone calls it.
        record: ``record(*case)`` issues the kernel launches of one forward and backward at a
            case's sizes on empty CPU tensors, inside ``_launch.record_launches`` (nothing
            runs: what the ahead-of-time compile tests and the kernel report compile).
        gpu_sizes: the sizes of the GPU check (the backbone's first stage at 224 px, batch 8,
            and at 512 px or more, batch 2) and of the kernel report's rooflines: keywords of
            ``example`` and ``record``.
    """
    name: str
    macs: Callable[..., int]
    can_run: Callable[..., List[str]]
    tolerances: Dict[torch.dtype, Tolerance] = field(
        default_factory=lambda: dict(DEFAULT_TOLERANCES))
    entry_points: Dict[str, Callable[..., int]] = field(default_factory=dict)
    settings: Dict[str, Any] = field(default_factory=dict)
    example: Optional[Callable[..., Example]] = None
    record: Optional[Callable[..., None]] = None
    gpu_sizes: Tuple[Dict[str, Any], ...] = ()


def sdpa_macs(batch: int, n_q: int, n_k: int, d_qk: int, d_v: int) -> int:
    """MACs of ``softmax(q k^T) v``: ``q k^T`` plus ``weights @ v`` for every query/key pair."""
    return batch * n_q * n_k * (d_qk + d_v)


def rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()


def check_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                name: str = 'tensor',
                tolerances: Optional[Dict[torch.dtype, Tolerance]] = None) -> None:
    """Assert ``actual`` (computed in ``dtype``) matches ``expected`` within the tolerance of
    ``dtype`` (default table: :data:`DEFAULT_TOLERANCES`)."""
    tol = (tolerances or DEFAULT_TOLERANCES)[dtype]
    assert actual.shape == expected.shape, f'{name}: shape {tuple(actual.shape)} != ' \
                                           f'{tuple(expected.shape)}'
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert torch.isfinite(actual).all(), f'{name}: non-finite values'
    err = actual - expected
    err_rms, ref_rms = rms(err), rms(expected)
    limit = tol.rtol * ref_rms + tol.atol
    assert err_rms <= limit, (f'{name} ({dtype}): RMS error {err_rms:.3e} > {limit:.3e} '
                              f'(rtol {tol.rtol:g} x RMS {ref_rms:.3e} + atol {tol.atol:g}); '
                              f'relative {err_rms / max(ref_rms, 1e-300):.3e}')
    err_max, ref_max = err.abs().max().item(), expected.abs().max().item()
    limit_max = tol.max_factor * (tol.rtol * ref_max + tol.atol)
    flat = int(err.abs().argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
    assert err_max <= limit_max, (f'{name} ({dtype}): max error {err_max:.3e} > {limit_max:.3e} '
                                  f'at index {where}')
