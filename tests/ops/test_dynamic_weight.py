"""WeightFormer's bilateral dynamic weight: Triton kernels (interpreted on CPU, compiled on CUDA)
vs the PyTorch reference, reference semantics, gradients, dispatch, input validation and
ahead-of-time compilation for sm_80 / sm_90."""
from typing import NamedTuple, Optional

import pytest
import torch

from mmeffattn.ops import _backend
from mmeffattn.ops.dynamic_weight import dynamic_weight, dynamic_weight_naive
from op_checks import DEVICE, DTYPES, HAS_CUDA, assert_close, needs_triton

pytestmark = pytest.mark.usefixtures('one_thread')


class Case(NamedTuple):
    B: int
    M: int
    C_in: int
    C_out: int
    dtype: str
    weight: Optional[str] = None  # dtype of the static weight, None: no weight
    scale: Optional[float] = None
    max_block_i: Optional[int] = None  # force the column sweep with a narrow tile

    @property
    def id(self) -> str:
        s = f'B{self.B}-M{self.M}-Ci{self.C_in}-Co{self.C_out}-{self.dtype}'
        s += f'-w{self.weight}' if self.weight else '-now'
        if self.scale is not None:
            s += f'-scale{self.scale:g}'
        if self.max_block_i is not None:
            s += f'-sweep{self.max_block_i}'
        return s


def make_inputs(case: Case, device: str = DEVICE, seed: int = 0):
    """u, v ``[B, M, C]`` (positive-mean, as SiLU outputs times a basis tend to be correlated)
    and the static weight (or None)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(case.B, case.M, case.C_in, generator=g) + 0.3
    v = torch.randn(case.B, case.M, case.C_out, generator=g) + 0.3
    dtype = DTYPES[case.dtype]
    u, v = u.to(device, dtype), v.to(device, dtype)
    w = None
    if case.weight:
        w = (0.02 * torch.randn(case.C_out, case.C_in, generator=g)).to(device,
                                                                       DTYPES[case.weight])
    return u, v, w


def n_tokens(case: Case) -> int:
    return 4 * case.M + 1  # WeightFormer divides by the tokens before 2x2 pooling


@pytest.fixture
def sweep(monkeypatch):
    """``sweep(case)`` narrows the launchers' widest column tile as the case asks."""
    from mmeffattn.ops.dynamic_weight import function

    def apply(case: Case) -> None:
        if case.max_block_i is not None:
            monkeypatch.setattr(function, 'MAX_BLOCK_I', case.max_block_i)
            monkeypatch.setattr(function, 'SWEEP_BLOCK_I', case.max_block_i)
    return apply


def check_against_reference(case: Case, backend: str, device: str = DEVICE) -> None:
    dtype = DTYPES[case.dtype]
    u, v, w = make_inputs(case, device)
    inputs = [t.requires_grad_() for t in (u, v, w) if t is not None]
    out = dynamic_weight(u, v, n_tokens(case), case.scale, w, backend=backend)
    expected_dtype = dtype if w is None else torch.promote_types(dtype, w.dtype)
    assert out.dtype == expected_dtype and out.shape == (case.B, case.C_out, case.C_in)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, out.dtype)
    out.backward(g)

    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    u64, v64 = inputs64[:2]
    w64 = inputs64[2] if w is not None else None
    ref = dynamic_weight_naive(u64, v64, n_tokens(case), case.scale, w64)
    ref.backward(g.double())
    assert_close(out, ref, dtype, 'out')
    for name, x, x64 in zip(['du', 'dv', 'dweight'], inputs, inputs64):
        assert_close(x.grad, x64.grad, dtype, name)


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
# Launches stay small (at most ~30 programs). Together the cases cover C_in and C_out not powers
# of two, both orders of C_in vs C_out, several token blocks (M 37, 100) and fewer tokens than a
# block (M 5), fp32/fp16 with or without a weight of the same or another dtype, a custom scale,
# and the sweep over several column tiles (forced with a narrow tile), fp32 and fp16.
TRITON_CASES = [
    Case(2, 37, 40, 72, 'fp32', 'fp32'),
    Case(2, 37, 40, 72, 'fp16', 'fp16'),
    Case(2, 37, 72, 40, 'fp16', 'fp32'),
    Case(1, 5, 24, 16, 'fp32', None, scale=0.3),
    Case(1, 100, 48, 48, 'fp32', 'fp32'),
    Case(2, 37, 72, 40, 'fp32', 'fp32', max_block_i=32),
    Case(1, 37, 72, 24, 'fp16', None, max_block_i=32),
]


@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case, sweep) -> None:
    sweep(case)
    check_against_reference(case, backend='triton')


@pytest.mark.skipif(not (HAS_CUDA and _backend.HAS_TRITON),
                    reason='bf16 tl.dot is wrong in Triton\'s interpreter: bf16 runs on CUDA only')
@pytest.mark.parametrize('case', [Case(2, 49, 192, 768, 'bf16', 'fp32'),
                                  Case(2, 37, 72, 40, 'bf16', None, max_block_i=32)],
                         ids=lambda c: c.id)
def test_triton_matches_reference_bf16_cuda(case: Case, sweep) -> None:
    sweep(case)
    check_against_reference(case, backend='triton', device='cuda')


@needs_triton
@pytest.mark.parametrize('max_block_i', [None, 32], ids=['one-tile', 'sweep'])
def test_triton_zero_rows(max_block_i, sweep) -> None:
    """Output rows whose raw weight is exactly zero (v is zero on those channels): the norm's
    gradient there is torch's zero subgradient, and nothing may become NaN."""
    case = Case(1, 21, 40, 24, 'fp32', 'fp32', max_block_i=max_block_i)
    sweep(case)
    u, v, w = make_inputs(case)
    v[:, :, ::3] = 0
    u, v, w = (t.requires_grad_() for t in (u, v, w))
    out = dynamic_weight(u, v, 84, None, w, backend='triton')
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out.backward(g)
    u64, v64, w64 = (t.detach().double().requires_grad_() for t in (u, v, w))
    ref = dynamic_weight_naive(u64, v64, 84, None, w64)
    ref.backward(g.double())
    assert_close(out, ref, torch.float32, 'out')
    for name, x, x64 in zip(['du', 'dv', 'dweight'], (u, v, w), (u64, v64, w64)):
        assert_close(x.grad, x64.grad, torch.float32, name)


@needs_triton
def test_triton_strided_inputs_no_grad_and_partial_grad() -> None:
    """u, v as views of one tensor (token stride != channels); inference needs no saved
    tensors; gradients only for the inputs that require them."""
    case = Case(2, 13, 24, 40, 'fp32', 'fp32')
    g = torch.Generator().manual_seed(0)
    uv = torch.randn(case.B, case.M, case.C_in + case.C_out, generator=g).to(DEVICE)
    u, v = uv.split([case.C_in, case.C_out], dim=-1)
    w = torch.randn(case.C_out, case.C_in, generator=g).to(DEVICE)
    with torch.no_grad():
        out = dynamic_weight(u, v, 52, None, w, backend='triton')
    assert_close(out, dynamic_weight_naive(u.double(), v.double(), 52, None, w.double()),
                 torch.float32, 'out')

    uv.requires_grad_()
    u, v = uv.split([case.C_in, case.C_out], dim=-1)
    dynamic_weight(u, v, 52, None, w, backend='triton').sum().backward()  # expanded gradient
    uv64 = uv.detach().double().requires_grad_()
    u64, v64 = uv64.split([case.C_in, case.C_out], dim=-1)
    dynamic_weight_naive(u64, v64, 52, None, w.double()).sum().backward()
    assert w.grad is None
    assert_close(uv.grad, uv64.grad, torch.float32, 'duv')


# ------------------------------------------------------------------------------------------
# the reference alone
# ------------------------------------------------------------------------------------------
def test_reference_is_official_formula() -> None:
    """The official ``DynLinear`` computes ``w = U^T V * scale / N`` in its ``[C_in, C_out]``
    layout and divides each column by its norm over the inputs plus one; ours is its transpose.
    Written out with explicit sums over tokens."""
    case = Case(2, 9, 12, 20, 'fp32', 'fp32')
    u, v, w = (t.double() for t in make_inputs(case, 'cpu'))
    scale, N = 12 ** -0.5, 36
    official = torch.einsum('bmi,bmo->bio', u, v) * scale / N  # [B, C_in, C_out]
    official = official / (official.norm(dim=1, keepdim=True) + 1)
    ours = dynamic_weight(u, v, N, weight=w, backend='reference')
    assert_close(ours, official.transpose(1, 2) + w, torch.float64, 'out')
    assert_close(dynamic_weight(u, v, N, backend='reference'), official.transpose(1, 2),
                 torch.float64, 'out without weight')
    # each row of the normalized part has norm ||R|| / (||R|| + 1) < 1
    norms = dynamic_weight(u, v, N, backend='reference').norm(dim=-1)
    assert (norms < 1).all() and (norms > 0).all()


def test_reference_gradcheck_fp64() -> None:
    u, v, w = (t.double().requires_grad_() for t in make_inputs(Case(2, 5, 6, 8, 'fp32', 'fp32'),
                                                                'cpu'))
    assert torch.autograd.gradcheck(lambda u, v, w: dynamic_weight_naive(u, v, 20, 0.7, w),
                                    (u, v, w), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_reference_low_precision(dtype: str) -> None:
    """The reference in low precision (the CPU path) stays within the dtype's tolerance of its
    float64 evaluation, forward and backward."""
    check_against_reference(Case(2, 37, 40, 72, dtype, None), backend='reference', device='cpu')


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _bad_inputs():
    u, v, w = torch.zeros(2, 5, 8), torch.zeros(2, 5, 12), torch.zeros(12, 8)
    return [
        ('u-rank', (u[0], v, 20), {}, r'u must be \[B, M, channels\] \(3 dims'),
        ('v-type', (u, v.numpy(), 20), {}, r'v must be a torch.Tensor'),
        ('tokens-differ', (u, v[:, :4], 20), {}, r'must agree on B and M'),
        ('batch-differ', (u, v[:1], 20), {}, r'must agree on B and M'),
        ('empty', (u[:, :0], v[:, :0], 20), {}, r'at least one token'),
        ('dtype', (u, v.half(), 20), {}, r'same dtype.*cast them'),
        ('int', (u.long(), v.long(), 20), {}, r'floating point'),
        ('device', (u, v.to('meta'), 20), {}, r'one device'),
        ('n-tokens-0', (u, v, 0), {}, r'n_tokens must be a positive finite float'),
        ('n-tokens-bool', (u, v, True), {}, r'n_tokens must be a positive finite float'),
        ('scale-str', (u, v, 20, '1'), {}, r'scale must be a finite float or None'),
        ('weight-transposed', (u, v, 20), dict(weight=w.t()),
         r'weight must be the static weight \[C_out, C_in\] = \[12, 8\].*transpose'),
        ('weight-int', (u, v, 20), dict(weight=w.long()), r'weight must be floating point'),
        ('weight-device', (u, v, 20), dict(weight=w.to('meta')), r'one device.*weight meta'),
    ]


@pytest.mark.parametrize('args,kwargs,match', [(a, k, m) for _, a, k, m in _bad_inputs()],
                         ids=[name for name, _, _, _ in _bad_inputs()])
def test_invalid_inputs(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        dynamic_weight(*args, **kwargs)

