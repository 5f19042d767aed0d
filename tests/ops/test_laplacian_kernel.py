"""LaplacianFormer's Laplacian kernel: Triton kernels (interpreted on CPU, compiled on CUDA) vs
the PyTorch reference, reference semantics, gradients, fp16 range, dispatch and input
validation. Ahead-of-time compilation: test_laplacian_aot.py."""
import math
from typing import NamedTuple

import pytest
import torch

from mmeffattn.ops import laplacian_kernel, laplacian_kernel_naive
from op_checks import DEVICE, DTYPES, assert_close, needs_triton

pytestmark = pytest.mark.usefixtures('one_thread')


class Case(NamedTuple):
    B: int
    H: int
    N: int
    M: int
    D: int
    dtype: str
    lam: float = 4.0
    layout: str = 'contiguous'  # or 'tokens': views of [B, tokens, heads, D] projections

    @property
    def id(self) -> str:
        return (f'B{self.B}-H{self.H}-N{self.N}-M{self.M}-D{self.D}-{self.dtype}'
                f'-lam{self.lam:g}-{self.layout}')


def make_inputs(case: Case, device: str = DEVICE, seed: int = 0):
    """x ``[B, H, N, D]``, y ``[B, H, M, D]`` (y near a subset of x, as pooled landmarks)."""
    g = torch.Generator().manual_seed(seed)
    if case.layout == 'tokens':
        x = torch.randn(case.B, case.N, case.H, case.D, generator=g).transpose(1, 2)
        y = torch.randn(case.B, case.M, case.H, case.D, generator=g).transpose(1, 2)
    else:
        x = torch.randn(case.B, case.H, case.N, case.D, generator=g)
        y = torch.randn(case.B, case.H, case.M, case.D, generator=g)
    y = 0.5 * y + 0.5 * x[:, :, :1]  # some pairs close (large kernel values), some far
    dtype = DTYPES[case.dtype]
    return x.to(device, dtype), y.to(device, dtype)


def check_against_reference(case: Case, backend: str, device: str = DEVICE) -> None:
    """Forward and both gradients (same upstream gradient) vs the reference in float64."""
    dtype = DTYPES[case.dtype]
    x, y = (t.requires_grad_() for t in make_inputs(case, device))
    out = laplacian_kernel(x, y, case.lam, backend=backend)
    assert out.dtype == dtype and out.shape == (case.B, case.H, case.N, case.M)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out.backward(g)
    x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
    ref = laplacian_kernel_naive(x64, y64, case.lam)
    ref.backward(g.double())
    assert_close(out, ref, dtype, 'out')
    assert_close(x.grad, x64.grad, dtype, 'dx')
    assert_close(y.grad, y64.grad, dtype, 'dy')


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
# Odd sizes exercise every mask: N and M not multiples of the 32-row tiles (37, 13; one token
# on either side), D not a power of two (24: 3 forward chunks of 8, 2 backward tiles of 16,
# the second partial; 5 and 40), the strided token layout, a narrow and a wide kernel.
TRITON_CASES = [
    Case(1, 2, 37, 13, 24, 'fp32'),
    Case(1, 2, 37, 13, 24, 'fp16'),
    Case(1, 2, 37, 13, 24, 'bf16'),
    Case(2, 1, 37, 1, 5, 'fp32', lam=0.7),
    Case(1, 2, 1, 13, 40, 'fp16', lam=20.0),
    Case(1, 2, 45, 33, 40, 'fp32', layout='tokens'),
]


@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case) -> None:
    check_against_reference(case, backend='triton')


@needs_triton
def test_triton_ties_and_no_grad() -> None:
    """x_i == y_j on some coordinates: sign(0) = 0 in both implementations; under no_grad
    nothing is saved and the output is the same."""
    case = Case(1, 2, 19, 7, 24, 'fp32')
    x, y = make_inputs(case)
    y[:, :, :3] = x[:, :, 4:7]  # whole rows equal
    y[:, :, 5, ::2] = x[:, :, 0, ::2]  # half the coordinates equal
    with torch.no_grad():
        out = laplacian_kernel(x, y, case.lam, backend='triton')
    assert_close(out, laplacian_kernel_naive(x.double(), y.double(), case.lam), torch.float32,
                 'out')
    x, y = x.requires_grad_(), y.requires_grad_()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    dx, dy = torch.autograd.grad(laplacian_kernel(x, y, case.lam, backend='triton'), (x, y), g)
    x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
    rdx, rdy = torch.autograd.grad(laplacian_kernel_naive(x64, y64, case.lam), (x64, y64),
                                   g.double())
    assert_close(dx, rdx, torch.float32, 'dx')
    assert_close(dy, rdy, torch.float32, 'dy')


@needs_triton
def test_triton_partial_grad() -> None:
    """Only y requires a gradient (x a detached query): only the dy launch runs."""
    x, y = make_inputs(Case(1, 2, 21, 9, 16, 'fp32'))
    y.requires_grad_()
    laplacian_kernel(x, y, 3.0, backend='triton').sum().backward()
    y64 = y.detach().double().requires_grad_()
    laplacian_kernel_naive(x.double(), y64, 3.0).sum().backward()
    assert x.grad is None
    assert_close(y.grad, y64.grad, torch.float32, 'dy')


@needs_triton
@pytest.mark.parametrize('N, dtype', [(5, 'fp32'), (70, 'fp32'), (5, 'fp16')],
                         ids=['one-split', 'three-splits', 'fp16'])
def test_triton_gradients_are_new_tensors(N: int, dtype: str) -> None:
    """dx and dy are new contiguous tensors, not views: one split of dy's fp32 partial sums is
    allocated as dy itself, several are summed into a new one (a view of a partial-sum buffer,
    or of the sum's result, was returned)."""
    from mmeffattn.ops.laplacian import function
    x, y = make_inputs(Case(1, 2, N, 7, 6, dtype))
    out = function.laplacian_fwd(x, y, 3.0)
    dx, dy = function.laplacian_bwd(torch.ones_like(out), x, y, out, 3.0)
    for name, t, ref in (('out', out, None), ('dx', dx, x), ('dy', dy, y)):
        assert t._base is None and t.is_contiguous(), name
        if ref is not None:
            assert (t.shape, t.dtype) == (ref.shape, ref.dtype), name
    x64, y64 = (t.double().requires_grad_() for t in (x, y))
    laplacian_kernel_naive(x64, y64, 3.0).sum().backward()
    assert_close(dy, y64.grad, DTYPES[dtype], 'dy')


@pytest.mark.parametrize('backend', [
    pytest.param('triton', marks=needs_triton), 'reference'])
def test_fp16_large_distances_do_not_underflow(backend: str) -> None:
    """fp16 inputs whose L1 distance (~96000) exceeds fp16's largest value (65504) while the
    kernel value exp(-96000 / 20000) ~ 8e-3 is well inside fp16's range: an fp16 accumulation
    overflows to inf and returns exp(-inf) = 0 everywhere; both backends accumulate in fp32."""
    g = torch.Generator().manual_seed(0)
    D = 64
    x = (1500. + torch.rand(1, 2, 9, D, generator=g)).half()
    y = (-torch.rand(1, 2, 5, D, generator=g)).half()
    lam = 2e4
    dist16 = (x[:, :, :, None] - y[:, :, None]).abs().sum(-1)  # the fp16 accumulation
    assert torch.isinf(dist16).all()  # the case is real: fp16 sums overflow here
    out = laplacian_kernel(x.to(DEVICE), y.to(DEVICE), lam, backend=backend)
    expected = laplacian_kernel_naive(x.double(), y.double(), lam)
    assert expected.min() > 5e-3 and expected.max() < 1e-2  # representable in fp16
    assert (out > 0).all()
    assert_close(out, expected, torch.float16, 'out')


# ------------------------------------------------------------------------------------------
# the reference alone
# ------------------------------------------------------------------------------------------
def test_reference_is_the_formula() -> None:
    """``exp(-sum_d |x_id - y_jd| / lam)`` written out with an explicit [N, M, D] tensor (what
    the official operator's L1 distance computes before its exponential)."""
    x, y = (t.double() for t in make_inputs(Case(2, 3, 11, 6, 10, 'fp32'), 'cpu'))
    lam = 2.5
    official = torch.exp(-(x[:, :, :, None, :] - y[:, :, None, :, :]).abs().sum(-1) / lam)
    assert_close(laplacian_kernel(x, y, lam, backend='reference'), official, torch.float64, 'out')
    same = laplacian_kernel(x, x, lam, backend='reference')
    assert torch.equal(same.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 11, dtype=torch.float64))


def test_reference_gradcheck_fp64() -> None:
    x, y = (t.double().requires_grad_() for t in make_inputs(Case(2, 2, 7, 5, 6, 'fp32'), 'cpu'))
    assert torch.autograd.gradcheck(lambda x, y: laplacian_kernel_naive(x, y, 1.7), (x, y),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_reference_low_precision(dtype: str) -> None:
    """The reference in low precision (the CPU path) stays within the dtype's tolerance of its
    float64 evaluation, forward and backward."""
    check_against_reference(Case(1, 2, 37, 13, 24, dtype), backend='reference', device='cpu')


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------
def small(dtype=torch.float32, device='cpu'):
    x, y = make_inputs(Case(1, 2, 5, 3, 8, 'fp32'), device)
    return x.to(dtype), y.to(dtype)


# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize('args, match', [
    ((_t(2, 5, 8), _t(2, 3, 8), 1.0), r'x must be \[B, heads, tokens, D\] \(4 dims\).*reshape'),
    ((_t(1, 2, 5, 8), _t(2, 3, 8), 1.0), r'y must be \[B, heads, tokens, D\]'),
    ((_t(1, 2, 5, 8), _t(2, 2, 3, 8), 1.0), r'must agree on B, heads and D.*same number of heads'),
    ((_t(1, 2, 5, 8), _t(1, 3, 3, 8), 1.0), r'must agree on B, heads and D'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 6), 1.0), r'must agree on B, heads and D'),
    ((_t(1, 2, 0, 8), _t(1, 2, 3, 8), 1.0), r'at least one element'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8, dtype=torch.float16), 1.0),
     r'same dtype.*cast them to one dtype'),
    ((_t(1, 2, 5, 8, dtype=torch.int64), _t(1, 2, 3, 8, dtype=torch.int64), 1.0),
     r'floating point'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8), 0.0), r'lam must be a positive finite float'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8), -2.0), r'lam must be a positive finite float'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8), math.nan), r'lam must be a positive finite float'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8), True), r'lam must be a positive finite float'),
    ((_t(1, 2, 5, 8), _t(1, 2, 3, 8), torch.tensor(1.0)), r'lam must be a positive finite float'),
    (([[1.0]], _t(1, 2, 3, 8), 1.0), r'x must be a torch.Tensor'),
])
def test_invalid_inputs(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        laplacian_kernel(*args)


def test_lam_accepts_python_and_numpy_numbers() -> None:
    import numpy as np
    x, y = small()
    ref = laplacian_kernel(x, y, 2.0, backend='reference')
    for lam in (2, np.float32(2.0), np.float64(2.0)):
        assert torch.equal(laplacian_kernel(x, y, lam, backend='reference'), ref)

