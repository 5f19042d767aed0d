#!/usr/bin/env python
"""Our Triton kernels against LaplacianFormer's official CUDA operators, on a CUDA GPU.

    python tools/analysis_tools/compare_official_kernels.py \\
        --laplacianformer-root PATH/TO/LaplacianFormer --json work_dirs/official_kernels.json

The official code is two CUDA operators: the pairwise L1 distance (``LaplaceSubtraction``) and a
Newton-Schulz inverse of ``mat + 0.01 I`` (``NewtonInverse``). The checkout is compiled here
(nvcc, this GPU's architecture) and compared with ``laplacian_kernel`` and ``newton_schulz_pinv``
(``backward='implicit'``) at LaplacianFormer's shapes: outputs and gradients must agree to
``--tol``, then forward and forward + backward are timed in alternation. Without a CUDA device
it exits with status 2.
"""
import argparse
import json
import os
import os.path as osp
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from mmeffattn.analysis.comparison import check_outputs, time_paired

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
NO_CUDA_EXIT = 2
#: the sources the official setup.py compiles, in its order
OFFICIAL_SOURCES = ('src/wrapper.cpp', 'src/LaplaceSubtraction_cuda.cu',
                    'src/LaplaceSubtraction_cuda_kernel.cu', 'src/NewtonInverse_cuda_kernel.cu',
                    'src/cuda_version.cu')
#: (B, heads, N, M, D): LaplacianFormer's query-landmark kernels at 224 and 1024 px (the GPU
#: checks of tools/gpu_check.py) and the landmark-landmark one
LAPLACE_SHAPES = ((8, 1, 3136, 49, 64), (2, 1, 16384, 256, 64), (8, 1, 49, 49, 64))
#: (B, heads, M): landmark matrices (the official operator takes M <= 128)
NEWTON_SHAPES = ((8, 1, 49), (2, 1, 128))
OFFICIAL_EPS = 0.01  # fixed inside the official NewtonInverse
#: LaplacianFormer's kernel width and Newton-Schulz steps
LAMBDA, NS_ITERS = 4., 20


def load_official(root: str, build_dir: str, verbose: bool = False):
    """Compile the official checkout's operators as a torch extension (minutes, cached in
    ``build_dir``) and return the module."""
    missing = [s for s in OFFICIAL_SOURCES if not osp.isfile(osp.join(root, s))]
    if missing:
        raise FileNotFoundError(f'{root} lacks {missing}: pass the root of a checkout of '
                                'github.com/BirdWithDreams/LaplacianFormer')
    from torch.utils.cpp_extension import load
    if 'TORCH_CUDA_ARCH_LIST' not in os.environ:  # this GPU only: a third of the build time
        major, minor = torch.cuda.get_device_capability()
        os.environ['TORCH_CUDA_ARCH_LIST'] = f'{major}.{minor}'
    os.makedirs(build_dir, exist_ok=True)
    # the official setup.py's flags, but the C++ standard left to torch (2.14's headers need
    # C++20; the checkout asks for C++17)
    flags = ['-O3', '-DWITH_CUDA']
    return load(name='laplacianformer_official', sources=[osp.join(root, s)
                                                          for s in OFFICIAL_SOURCES],
                extra_include_paths=[osp.join(root, 'include')], extra_cflags=flags,
                extra_cuda_cflags=flags + ['--expt-relaxed-constexpr', '--use_fast_math'],
                build_directory=build_dir, verbose=verbose)


# -- the official operators as differentiable functions (their interface as we read it) --
class OfficialL1(torch.autograd.Function):
    """``out[b, h, i, j] = sum_d |q[b, h, i, d] - kt[b, h, d, j]|`` by the official kernels."""

    @staticmethod
    def forward(ctx, ext, q: torch.Tensor, kt: torch.Tensor) -> torch.Tensor:
        q, kt = q.contiguous(), kt.contiguous()
        out = q.new_empty(q.shape[:3] + kt.shape[3:])
        ext.LaplaceSubtraction_forward(q, kt, out)
        ctx.ext = ext
        ctx.save_for_backward(q, kt)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, kt = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dkt = torch.zeros_like(q), torch.zeros_like(kt)
        ctx.ext.LaplaceSubtraction_backward_query(grad, q, kt, dq)
        ctx.ext.LaplaceSubtraction_backward_key(grad, q, kt, dkt)
        return None, dq, dkt


class OfficialInverse(torch.autograd.Function):
    """Newton-Schulz inverse of ``a + 0.01 I`` by the official kernels (implicit backward)."""

    @staticmethod
    def forward(ctx, ext, a: torch.Tensor, iters: int) -> torch.Tensor:
        a = a.contiguous()
        out = torch.empty_like(a)
        ext.NewtonInverse_forward(a, out, iters)
        ctx.ext = ext
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inv, ) = ctx.saved_tensors
        da = torch.empty_like(inv)
        ctx.ext.NewtonInverse_backward(grad.contiguous(), inv, da)
        return None, da, None


def official_laplacian(ext, q: torch.Tensor, k: torch.Tensor, lam: float) -> torch.Tensor:
    """The official pipeline: L1 distance (keys transposed, as the operator takes them), then
    the exponential in PyTorch."""
    return torch.exp(OfficialL1.apply(ext, q, k.transpose(-2, -1)) / -lam)


# -- cases --
@dataclass
class KernelCase:
    """One shape and dtype: ``fns`` maps a name (the official one first) to ``fn(*inputs)``;
    outputs and input gradients must agree."""
    name: str
    dtype: torch.dtype
    fns: Dict[str, Callable[..., torch.Tensor]]
    inputs: List[torch.Tensor]

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace('torch.', '')

    def outputs(self) -> Dict[str, Callable[[], torch.Tensor]]:
        return {name: (lambda fn=fn: fn(*self.inputs)) for name, fn in self.fns.items()}

    def gradients(self, seed: int = 0) -> Dict[str, List[torch.Tensor]]:
        """Each function's input gradients for the same seeded output gradient."""
        grads = {}
        for name, fn in self.fns.items():
            xs = [x.detach().requires_grad_() for x in self.inputs]
            out = fn(*xs)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
            out.backward(g.to(out.device, out.dtype))
            grads[name] = [x.grad for x in xs]
        return grads

    def timed(self, backward: bool) -> Dict[str, Callable[[], None]]:
        xs = [x.detach().requires_grad_(backward) for x in self.inputs]
        calls = {}
        for name, fn in self.fns.items():
            def call(fn=fn) -> None:
                if backward:
                    for x in xs:
                        x.grad = None
                    out = fn(*xs)
                    out.backward(torch.ones_like(out))
                else:
                    with torch.no_grad():
                        fn(*xs)
            calls[name] = call
        return calls


def laplace_cases(ext, device, dtypes: Sequence[torch.dtype], lam: float,
                  shapes: Sequence[Tuple[int, ...]] = LAPLACE_SHAPES) -> List[KernelCase]:
    from mmeffattn.ops import laplacian_kernel
    cases = []
    for B, h, N, M, D in shapes:
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            q, k = (torch.randn(B, h, n, D, generator=g).mul(0.1).to(device, dtype)
                    for n in (N, M))
            fns = {'official': lambda q, k: official_laplacian(ext, q, k, lam),
                   'ours': lambda q, k: laplacian_kernel(q, k, lam, backend=_backend(device))}
            cases.append(KernelCase(f'laplacian B{B}-H{h}-N{N}-M{M}-D{D}', dtype, fns, [q, k]))
    return cases


def newton_cases(ext, device, dtypes: Sequence[torch.dtype], iters: int, lam: float,
                 shapes: Sequence[Tuple[int, ...]] = NEWTON_SHAPES) -> List[KernelCase]:
    """Laplacian kernel matrices of random landmarks (symmetric positive definite, as in the
    model), one per (batch, head)."""
    from mmeffattn.ops import newton_schulz_pinv
    cases = []
    for B, h, M in shapes:
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            lm = torch.randn(B, h, M, 64, generator=g, dtype=torch.float64).mul(0.1)
            a = torch.exp(-torch.cdist(lm, lm, p=1) / lam).to(device, dtype)
            fns = {'official': lambda a: OfficialInverse.apply(ext, a, iters),
                   'ours': lambda a: newton_schulz_pinv(a, iters, OFFICIAL_EPS, check=False,
                                                        backward='implicit',
                                                        backend=_backend(device))}
            cases.append(KernelCase(f'newton B{B}-H{h}-M{M}-it{iters}', dtype, fns, [a]))
    return cases


def _backend(device) -> Optional[str]:
    """The Triton kernels on a GPU; elsewhere (a test's stand-in) the automatic choice."""
    return 'triton' if torch.device(device).type == 'cuda' else None


def compare(case: KernelCase, tol: float, rounds: int, device) -> Dict[str, Any]:
    """Check that the two sides agree, then time them."""
    hint = 'our op and the official operator do not compute the same thing here'
    row: Dict[str, Any] = dict(case=case.name, dtype=case.dtype_name)
    row['output_diff'] = check_outputs(case.outputs(), tol, hint)['ours']
    grads = case.gradients()
    for i, (off, ours) in enumerate(zip(grads['official'], grads['ours'])):
        row[f'grad{i}_diff'] = check_outputs({'official': lambda off=off: off,
                                              'ours': lambda ours=ours: ours},
                                             tol, f'gradient of input {i}: {hint}')['ours']
    for mode, backward in (('fwd', False), ('fwd_bwd', True)):
        ms, ratio = time_paired(case.timed(backward), rounds, torch.device(device))
        row[f'{mode}_ms'], row[f'{mode}_ratio'] = ms, ratio['ours']
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--laplacianformer-root', required=True,
                   help='checkout of github.com/BirdWithDreams/LaplacianFormer')
    p.add_argument('--build-dir', default=osp.join(ROOT, 'work_dirs', 'official_kernels_build'))
    p.add_argument('--dtypes', nargs='+', default=['fp32', 'fp16'], choices=['fp32', 'fp16'],
                   help='the official L1 operator has no bf16')
    p.add_argument('--rounds', type=int, default=20)
    p.add_argument('--tol', type=float, nargs=2, default=[1e-4, 1e-2], metavar=('FP32', 'FP16'),
                   help='largest relative difference accepted, fp32 and fp16')
    p.add_argument('--json', help='write the rows to this file')
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print('compare_official_kernels: the official operators are CUDA only; run this on a '
              'machine with an NVIDIA GPU', file=sys.stderr)
        return NO_CUDA_EXIT
    ext = load_official(args.laplacianformer_root, args.build_dir)
    device = torch.device('cuda')
    dtypes = [dict(fp32=torch.float32, fp16=torch.float16)[d] for d in args.dtypes]
    rows = []
    for case in (laplace_cases(ext, device, dtypes, LAMBDA)
                 + newton_cases(ext, device, dtypes, NS_ITERS, LAMBDA)):
        tol = args.tol[0] if case.dtype == torch.float32 else args.tol[1]
        try:
            row = compare(case, tol, args.rounds, device)
            print(f'{row["case"]} [{row["dtype"]}]: forward ours {row["fwd_ms"]["ours"]:.3f} ms '
                  f'vs official {row["fwd_ms"]["official"]:.3f} ms ({row["fwd_ratio"]:.2f}x); '
                  f'fwd+bwd {row["fwd_bwd_ms"]["ours"]:.3f} vs '
                  f'{row["fwd_bwd_ms"]["official"]:.3f} ms ({row["fwd_bwd_ratio"]:.2f}x); '
                  f'output within {row["output_diff"]:.1e}', flush=True)
        except Exception as e:  # one failing case must not hide the others
            row = dict(case=case.name, dtype=case.dtype_name, error=f'{type(e).__name__}: {e}')
            print(f'{case.name} [{row["dtype"]}]: FAIL {row["error"][:300]}', flush=True)
        rows.append(row)
    if args.json:
        from mmeffattn.analysis.benchmarking import environment
        with open(args.json, 'w') as f:
            json.dump(dict(environment=environment(device, torch.float32), rounds=args.rounds,
                           tol=args.tol, rows=rows), f, indent=1)
    return 0 if all('error' not in r for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
