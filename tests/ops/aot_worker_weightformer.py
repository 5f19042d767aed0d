"""Compile the dynamic-weight and dynamic-dwconv kernels ahead of time for NVIDIA targets,
without a GPU (run as a script).

Usage: ``python tests/ops/aot_worker_weightformer.py CASES_JSON [ARCH ...]`` with Triton's
interpreter OFF. CASES_JSON is a list of dicts with ``"op"``: ``"dynamic_weight"`` (keys ``B, M,
C_in, C_out, dtype, weight``) or ``"dynamic_dwconv"`` (keys ``B, C, H, W, K, dtype, normalize,
weight, bias, layout``). For each case the real launchers run forward and backward on small CPU
tensors inside the op's ``function.record_launches()``, which records every launch instead of
running it; each distinct launch is then compiled for each architecture. The compilation and
the resource read-out (``specialise``, ``compile_one``) are those of ``aot_worker.py`` (the SEMA
worker), reused as they are. Prints one JSON line per (launch, arch).
"""
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

assert not os.environ.get('TRITON_INTERPRET'), 'run with Triton\'s interpreter off'

import torch  # noqa: E402

import aot_worker  # noqa: E402  (tests/ops, the script's directory)
from mmeffattn.ops.dyn_dwconv import function as dwconv_function  # noqa: E402
from mmeffattn.ops.dyn_weight import function as weight_function  # noqa: E402

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}


def record_dynamic_weight(case: dict) -> list:
    """Forward + backward launches on contiguous u, v (the model's ``SiLU(A) @ basis``)."""
    dtype = DTYPES[case['dtype']]
    B, M, C_in, C_out = case['B'], case['M'], case['C_in'], case['C_out']
    u, v = torch.empty(B, M, C_in, dtype=dtype), torch.empty(B, M, C_out, dtype=dtype)
    weight = (torch.empty(C_out, C_in, dtype=DTYPES[case['weight']]) if case['weight']
              else None)
    s = C_in ** -0.5 / (4 * M)
    with weight_function.record_launches() as launches:
        out = weight_function.dynamic_weight_fwd(u, v, s, weight)
        weight_function.dynamic_weight_bwd(torch.empty_like(out), u, v, s)
    return launches


def record_dynamic_dwconv(case: dict) -> list:
    """Forward + backward launches on the layout the model passes (``'tokens'``: the
    channels-last view of a ``[B, H*W, C]`` token tensor) or plain NCHW (``'nchw'``)."""
    dtype = DTYPES[case['dtype']]
    B, C, H, W, K = case['B'], case['C'], case['H'], case['W'], case['K']
    if case['layout'] == 'tokens':
        x = torch.empty(B, H * W, C, dtype=dtype).transpose(1, 2).reshape(B, C, H, W)
    else:
        x = torch.empty(B, C, H, W, dtype=dtype)
    kernel = torch.empty(B, C, K, K, dtype=dtype)
    weight = torch.empty(C, 1, K, K) if case['weight'] else None
    bias = torch.empty(C) if case['bias'] else None
    with dwconv_function.record_launches() as launches:
        out = dwconv_function.dynamic_dwconv_fwd(x, kernel, bias, weight, case['normalize'])
        dwconv_function.dynamic_dwconv_bwd(torch.empty_like(out), x, kernel, weight,
                                           case['normalize'], bias is not None)
    return launches


RECORDERS = {'dynamic_weight': record_dynamic_weight, 'dynamic_dwconv': record_dynamic_dwconv}


def main() -> None:
    cases = json.loads(sys.argv[1])
    archs = [int(a) for a in sys.argv[2:]] or [80, 90]
    jobs, seen = aot_worker._JOBS, set()
    for case in cases:
        for launch in RECORDERS[case['op']](case):
            cfg = launch.config
            key_args = aot_worker.specialise(launch, archs[0])[1:4]
            key = (cfg.kernel.__name__, repr(key_args), repr(cfg.launch_options))
            if key in seen:
                continue
            seen.add(key)
            meta = dict(case=case, role=launch.role, kernel=cfg.kernel.__name__,
                        constexprs=dict(cfg.constexprs), num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages, maxnreg=cfg.maxnreg)
            jobs += [(launch, arch, meta) for arch in archs]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    # fork: the workers inherit the recorded launches through aot_worker._JOBS
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context('fork')) as pool:
        for result in pool.map(aot_worker.compile_one, range(len(jobs))):
            print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
