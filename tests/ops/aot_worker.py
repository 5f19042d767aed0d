"""Compile any op's kernels ahead of time for NVIDIA targets, without a GPU (run as a script).

Usage: ``python tests/ops/aot_worker.py CASES_JSON [ARCH ...]`` with Triton's interpreter OFF.
CASES_JSON is a list of cases (:func:`mmeffattn.analysis.kernels.case`: ``"op"``, a public
op name, and the arguments of its ``spec.record``). For each case the op's real launchers
run forward and backward on small CPU tensors inside ``_launch.record_launches()``, which
records every launch (kernel, grid, arguments, constexprs, num_warps, num_stages) instead of
running it; each distinct launch is then compiled for each architecture with the same
specialisation Triton's JIT would apply to those arguments. Prints one JSON line per (launch,
arch): registers and stack from ``cuobjdump -res-usage``, shared memory from the compiled
metadata.
"""
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from mmeffattn.analysis.kernels import compile_launch, record, specialise


_JOBS: list = []  # (launch, arch, meta), set before the worker processes fork


def compile_one(index: int) -> dict:
    launch, arch, meta = _JOBS[index]
    r = compile_launch(launch, arch)
    return dict(meta, arch=arch, **{k: r[k] for k in ('regs', 'stack', 'local', 'shared',
                                                      'seconds')})


def main() -> None:
    assert not os.environ.get('TRITON_INTERPRET'), "run with Triton's interpreter off"
    cases = json.loads(sys.argv[1])
    archs = [int(a) for a in sys.argv[2:]] or [80, 90]
    jobs, seen = _JOBS, set()
    for case in cases:
        for launch in record(case):
            cfg = launch.config
            key_args = specialise(launch, archs[0])[1:4]
            key = (cfg.kernel.__name__, repr(key_args), repr(cfg.launch_options))
            if key in seen:
                continue
            seen.add(key)
            meta = dict(case=case, role=launch.role, kernel=cfg.kernel.__name__,
                        constexprs=dict(cfg.constexprs), num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages, maxnreg=cfg.maxnreg)
            jobs += [(launch, arch, meta) for arch in archs]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    # fork: the workers inherit the recorded launches (kernels and CPU tensors) through _JOBS
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context('fork')) as pool:
        for result in pool.map(compile_one, range(len(jobs))):
            print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
