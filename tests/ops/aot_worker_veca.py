"""Compile the core-periphery attention kernels (VECA) ahead of time for NVIDIA targets,
without a GPU (run as a script).

Usage: ``python tests/ops/aot_worker_veca.py CASES_JSON [ARCH ...]`` with Triton's interpreter
OFF. CASES_JSON is a list of ``{"op": "core_periphery", "D", "C", "N", "dtype", "rope",
"splits"}`` (``"rope"``: null, ``"batch"`` for ``[B, C + N, D]`` tables or ``"shared"`` for
``[1, C + N, D]``; ``"splits"``: null for the launchers' default, or a count forced to compile
the split path). For each case the real launchers run forward and backward on small CPU tensors,
laid out as the VECA backbone passes them (views of ``[B, C + N, heads, D]`` projections),
inside ``function.record_launches()``, which records every launch instead of running it.

The rest is ``aot_worker_weightformer.py``'s ``main`` (deduplication of the launches, then
``aot_worker.py``'s ``specialise`` and ``compile_one`` in a process pool), reused as it is: this
script only registers its recorder there. Prints one JSON line per (launch, arch).
"""
import os

assert not os.environ.get('TRITON_INTERPRET'), 'run with Triton\'s interpreter off'

import torch  # noqa: E402

import aot_worker_weightformer  # noqa: E402  (tests/ops, the script's directory)
from mmeffattn.ops.core_periphery import function  # noqa: E402


def record_core_periphery(case: dict) -> list:
    """The launches of one forward + backward, as the launchers issue them."""
    dtype = aot_worker_weightformer.DTYPES[case['dtype']]
    B, heads, C, D = 2, 2, case['C'], case['D']
    L = C + case['N']
    q, k, v = (torch.empty(B, L, heads, D, dtype=dtype).transpose(1, 2) for _ in range(3))
    cos = sin = None
    if case['rope']:
        cos, sin = (torch.empty(B if case['rope'] == 'batch' else 1, L, D, dtype=dtype)
                    for _ in range(2))
    scale = D ** -0.5
    with function.record_launches() as launches:
        o, lse = function.cp_fwd(q, k, v, cos, sin, C, scale, splits=case['splits'])
        function.cp_bwd(torch.empty_like(o), q, k, v, cos, sin, o, lse, C, scale,
                        splits=case['splits'])
    return launches


aot_worker_weightformer.RECORDERS['core_periphery'] = record_core_periphery

if __name__ == '__main__':
    aot_worker_weightformer.main()
