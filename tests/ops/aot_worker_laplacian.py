"""Compile the LaplacianFormer kernels (Laplacian kernel, Newton-Schulz inverse) ahead of time
for NVIDIA targets, without a GPU (run as a script).

Usage: ``python tests/ops/aot_worker_laplacian.py CASES_JSON [ARCH ...]`` with Triton's
interpreter OFF. CASES_JSON is a list of dicts with ``"op"``: ``"laplacian"`` (keys ``N, M, D,
dtype``; optional ``"layout"``: ``"contiguous"``, the default, or ``"tokens"``: views of a
``[B, tokens, heads, D]`` projection) or ``"newton_schulz"`` (keys ``M, iters, dtype``). For each
case the real launchers run forward and backward on small CPU tensors inside the op's
``function.record_launches()``, which records every launch instead of running it; each distinct
launch is then compiled for each architecture by the driver of ``aot_worker_weightformer.py``
(itself built on ``aot_worker.py``'s ``specialise`` and ``compile_one``), reused as it is.
Prints one JSON line per (launch, arch).
"""
import os

assert not os.environ.get('TRITON_INTERPRET'), 'run with Triton\'s interpreter off'

import torch  # noqa: E402

import aot_worker_weightformer  # noqa: E402  (tests/ops, the script's directory)
from mmeffattn.ops.laplacian import function as lap_function  # noqa: E402
from mmeffattn.ops.newton_schulz import function as ns_function  # noqa: E402

DTYPES = aot_worker_weightformer.DTYPES


def record_laplacian(case: dict) -> list:
    """Forward + backward launches (dx and dy) of one case."""
    dtype = DTYPES[case['dtype']]
    N, M, D = case['N'], case['M'], case['D']
    if case.get('layout', 'contiguous') == 'tokens':
        x = torch.empty(1, N, 2, D, dtype=dtype).transpose(1, 2)
        y = torch.empty(1, M, 2, D, dtype=dtype).transpose(1, 2)
    else:
        x, y = torch.empty(1, 2, N, D, dtype=dtype), torch.empty(1, 2, M, D, dtype=dtype)
    with lap_function.record_launches() as launches:
        out = lap_function.laplacian_fwd(x, y, 1.0)
        lap_function.laplacian_bwd(torch.empty_like(out), x, y, out, 1.0)
    return launches


def record_newton_schulz(case: dict) -> list:
    """On-chip forward (keeping its iterates) + backward launches of one case."""
    dtype = DTYPES[case['dtype']]
    M, iters = case['M'], case['iters']
    assert M <= ns_function.MAX_ONCHIP_M, 'larger matrices run batched matmuls, no kernel'
    a = torch.empty(1, 2, M, M, dtype=dtype)
    with ns_function.record_launches() as launches:
        out, ws = ns_function.newton_schulz_fwd(a, iters, 0.01, True)
        ns_function.newton_schulz_fwd(a, iters, 0.01, False)  # inference: nothing stored
        ns_function.newton_schulz_bwd(torch.empty_like(out), a, ws, iters, 0.01)
    return launches


RECORDERS = {'laplacian': record_laplacian, 'newton_schulz': record_newton_schulz}


def main() -> None:
    # the weightformer worker's driver (dedup of launches, parallel compiles, one JSON line per
    # launch and arch), run over this worker's recorders
    aot_worker_weightformer.RECORDERS = RECORDERS
    aot_worker_weightformer.main()


if __name__ == '__main__':
    main()
