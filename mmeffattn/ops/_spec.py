"""What each op declares for the tools that work across ops (one ``<op>/spec.py`` per folder).

``analysis/flops.py`` (MAC counters), ``analysis/dispersion.py`` (attention kinds),
``tools/benchmark_ops.py`` (benchmark kinds), ``tools/gpu_check.py`` (kernel-vs-reference
cases), the ahead-of-time compilation worker and test (``tests/ops/aot_worker.py``,
``tests/ops/test_aot.py``) and the op tests' tolerance table read these declarations through
:func:`all_specs`; none of them keeps a list of ops. Adding an op is a new folder with a
``spec.py`` defining ``SPEC = OpSpec(...)`` plus one export line in ``mmeffattn/ops/__init__.py``.

This module imports without Triton; a spec imports its op's Triton modules only inside the
functions that need them (AOT recording).
"""
import importlib
import math
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch


#: dtype names used by test ids, AOT cases and reports
DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}


class Tolerance(NamedTuple):
    """Relative RMS error with an absolute floor, and the slack of the element-wise check."""
    rtol: float
    atol: float
    max_factor: float


#: the default tolerance table (relative RMS error, absolute floor), per dtype: an op's result
#: computed in ``dtype`` against its reference evaluated in float64 on the same inputs
#:     rms(actual - expected) <= rtol * rms(expected) + atol
#:     max|actual - expected| <= max_factor * (rtol * max|expected| + atol)
DEFAULT_TOLERANCES: Dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-10, 1e-12, 10.),
    torch.float32: Tolerance(1e-5, 1e-7, 20.),
    torch.float16: Tolerance(2e-3, 1e-5, 20.),
    torch.bfloat16: Tolerance(1.6e-2, 1e-4, 20.),
}

#: ``make(device, dtype) -> (fn(backend, *inputs), inputs)``: one kernel-vs-reference check
GpuCheck = Callable[[Any, Any], Tuple[Callable, List[torch.Tensor]]]
#: ``make(n, settings, device, dtype) -> (run(backend), MACs, bytes, info)``: one benchmark kind
#: at about ``n`` tokens; ``settings`` has ``batch``, ``heads``, ``head_dim``
Benchmark = Callable[[int, Any, torch.device, torch.dtype],
                     Tuple[Callable[[Optional[str]], Any], int, int, Dict[str, Any]]]
#: ``implied(q, k, hw, qs, options) -> [B, h, R, N]`` weights of the R queries ``qs`` over the N
#: keys (rows sum to 1); ``options`` are the keyword options of ``dispersion.implied_weights``
AttentionKind = Callable[..., torch.Tensor]


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


@dataclass(frozen=True)
class Roofline:
    """An op's analytic roofline at one GPU-check shape (``tools/analysis_tools/
    kernel_report.py``, ``tools/gpu_check.py``).

    Args:
        check: the name of the op's GPU check with these shapes (``OpSpec.gpu_checks``); the
            GPU script times that call (forward + backward) against the prediction.
        costs: ``costs(dtype_name) -> {'fwd': Cost, 'bwd': Cost}`` at those shapes.
        aot_case: an ``aot.record`` case at those shapes: the launches the launchers really
            issue there (what the kernel report compiles).
        previous: the same for the op's previous kernel design, when a change to the kernels
            changed it (the report's before/after table); None otherwise.
    """
    check: str
    costs: Callable[[str], Dict[str, 'Cost']]
    aot_case: Dict[str, Any]
    previous: Optional[Callable[[str], Dict[str, 'Cost']]] = None


@dataclass(frozen=True)
class AotSpec:
    """Ahead-of-time compilation (``tests/ops/aot_worker.py``): ``record(case)`` runs the real
    launchers forward and backward inside ``_launch.record_launches()`` and returns the recorded
    launches; ``subset`` compiles by default, ``full`` with ``--run-slow``; ``kernels`` must all
    be compiled by the subset."""
    record: Callable[[Dict[str, Any]], list]
    subset: List[Dict[str, Any]]
    full: List[Dict[str, Any]]
    kernels: frozenset


@dataclass(frozen=True)
class OpSpec:
    """One op's declarations.

    Args:
        name: the public op, an attribute of :mod:`mmeffattn.ops` (e.g. ``'sema_attention'``).
        macs: analytic multiply-accumulates of one call, from the op's own arguments.
        can_run: the op's ``*_triton_reasons(*tensors, ...)`` (``[]``: the kernels can run).
        tolerances: per-dtype :class:`Tolerance` of the kernels against the fp64 reference.
        gpu_checks: ``(name, make)`` kernel-vs-reference cases at the backbones' sizes.
        benchmarks: benchmark kind -> :data:`Benchmark` (``tools/benchmark_ops.py``).
        benchmark_settings: the op settings the benchmarks use (recorded in the report).
        attention_kinds: dispersion kind -> :data:`AttentionKind`, for ops that imply
            attention weights (``analysis/dispersion.py``).
        aot: what the AOT worker compiles (None: no kernels to compile).
        rooflines: analytic bytes/FLOPs per call at GPU-check shapes (:class:`Roofline`).
        entry_points: the op's other public functions (each an attribute of
            :mod:`mmeffattn.ops`, taking its inputs packed differently, e.g.
            ``sema_attention_qk``) -> their analytic MACs from their own arguments.
    """
    name: str
    macs: Callable[..., int]
    can_run: Callable[..., List[str]]
    tolerances: Dict[torch.dtype, Tolerance] = field(
        default_factory=lambda: dict(DEFAULT_TOLERANCES))
    gpu_checks: Sequence[Tuple[str, GpuCheck]] = ()
    benchmarks: Dict[str, Benchmark] = field(default_factory=dict)
    benchmark_settings: Dict[str, Any] = field(default_factory=dict)
    attention_kinds: Dict[str, AttentionKind] = field(default_factory=dict)
    aot: Optional[AotSpec] = None
    rooflines: Sequence[Roofline] = ()
    entry_points: Dict[str, Callable[..., int]] = field(default_factory=dict)


_SPECS: Optional[List[OpSpec]] = None


def all_specs() -> List[OpSpec]:
    """Every op's spec: the ``SPEC`` of each ``mmeffattn/ops/<folder>/spec.py``, by folder name
    (folders without a ``spec.py``, such as deprecated aliases, are not ops)."""
    global _SPECS
    if _SPECS is None:
        here = osp.dirname(osp.abspath(__file__))
        folders = sorted(d for d in os.listdir(here) if osp.isfile(osp.join(here, d, 'spec.py')))
        _SPECS = [importlib.import_module(f'{__package__}.{d}.spec').SPEC for d in folders]
    return list(_SPECS)


def get_spec(name: str) -> OpSpec:
    """The spec of the public op ``name`` (ValueError listing the ops otherwise)."""
    specs = {s.name: s for s in all_specs()}
    if name not in specs:
        raise ValueError(f'no op spec named {name!r}; ops with a spec: {sorted(specs)}')
    return specs[name]


# ---------------------------------------------------------------------------------------------
# helpers the specs share
# ---------------------------------------------------------------------------------------------
def sdpa_macs(batch: int, n_q: int, n_k: int, d_qk: int, d_v: int) -> int:
    """MACs of ``softmax(q k^T) v``: ``q k^T`` plus ``weights @ v`` for every query/key pair."""
    return batch * n_q * n_k * (d_qk + d_v)


def square_grid(n: int) -> Tuple[int, int]:
    """The square token grid closest to ``n`` tokens (benchmarks)."""
    side = max(1, round(math.sqrt(n)))
    return side, side


def randn(*shape: int, device: Any, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Standard normal (times ``scale``) drawn in fp32 and cast, so every dtype sees the same
    values for one seed (GPU checks)."""
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


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


def rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()
