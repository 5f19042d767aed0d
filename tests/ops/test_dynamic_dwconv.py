"""Per-sample dynamic depthwise convolution: Triton kernels (interpreted on CPU, compiled on
CUDA) vs the PyTorch reference, reference semantics, gradients, dispatch, input validation and
ahead-of-time compilation for sm_80 / sm_90."""
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F

from mmeffattn.ops.dynamic_dwconv import dynamic_dwconv, dynamic_dwconv_naive
from mmeffattn.ops.dynamic_dwconv import op as dc_op
from op_checks import DEVICE, DTYPES, assert_close, needs_triton

pytestmark = pytest.mark.usefixtures('one_thread')


class Case(NamedTuple):
    B: int
    C: int
    H: int
    W: int
    K: int
    dtype: str
    normalize: bool = True
    weight: bool = True
    bias: bool = True
    layout: str = 'nchw'  # or 'tokens': the channels-last view of a [B, H*W, C] token tensor
    kernel_dtype: Optional[str] = None  # default: dtype

    @property
    def id(self) -> str:
        s = f'B{self.B}-C{self.C}-{self.H}x{self.W}-K{self.K}-{self.dtype}'
        if self.kernel_dtype:
            s += f'-k{self.kernel_dtype}'
        s += '-norm' if self.normalize else ''
        s += '-w' if self.weight else ''
        s += '-b' if self.bias else ''
        return s + f'-{self.layout}'


def make_inputs(case: Case, device: str = DEVICE, seed: int = 0):
    """x ``[B, C, H, W]`` in the case's layout, kernel ``[B, C, K, K]``, bias ``[C]`` and the
    static kernel ``[C, 1, K, K]`` (fp32 parameters, as in the model), or None."""
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[case.dtype]
    B, C, H, W, K = case.B, case.C, case.H, case.W, case.K
    if case.layout == 'tokens':
        x = torch.randn(B, H * W, C, generator=g).to(device, dtype)
        x = x.transpose(1, 2).reshape(B, C, H, W)
    else:
        x = torch.randn(B, C, H, W, generator=g).to(device, dtype)
    kernel = torch.randn(B, C, K, K, generator=g).to(device, DTYPES[case.kernel_dtype or
                                                                     case.dtype])
    bias = torch.randn(C, generator=g).to(device) if case.bias else None
    weight = (0.3 * torch.randn(C, 1, K, K, generator=g)).to(device) if case.weight else None
    return x, kernel, bias, weight


def check_against_reference(case: Case, backend: str, device: str = DEVICE) -> None:
    dtype = DTYPES[case.dtype]
    x, kernel, bias, weight = make_inputs(case, device)
    tensors = [t for t in (x, kernel, bias, weight) if t is not None]
    for t in tensors:
        t.requires_grad_()
    out = dynamic_dwconv(x, kernel, bias, weight, normalize=case.normalize, backend=backend)
    assert out.dtype == dtype and out.shape == x.shape
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out.backward(dy)

    x64, k64, b64, w64 = (None if t is None else t.detach().double().requires_grad_()
                          for t in (x, kernel, bias, weight))
    ref = dynamic_dwconv_naive(x64, k64, b64, w64, case.normalize)
    ref.backward(dy.double())
    # inputs in a lower precision than fp32 (x or the kernel) set the tolerance
    tol_dtype = dtype if case.kernel_dtype is None else DTYPES[case.kernel_dtype]
    assert_close(out, ref, tol_dtype, 'out')
    for name, t, t64 in zip(['dx', 'dkernel', 'dbias', 'dweight'], (x, kernel, bias, weight),
                            (x64, k64, b64, w64)):
        if t is not None:
            assert t.grad.dtype == t.dtype
            assert_close(t.grad, t64.grad, tol_dtype, name)


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
# Launches stay small (at most 16 programs, each looping over K*K taps). Together the cases cover
# odd channel counts (a partial channel block) and grids (partial pixel blocks), K 1/3/5/7
# including kernels larger than the grid and a grid of one row, both layouts, every combination
# of normalize/weight/bias that matters, fp32/fp16/bf16 (no tl.dot: bf16 is exact in the
# interpreter) and a bf16 kernel with an fp32 x (as autocast produces).
TRITON_CASES = [
    Case(2, 40, 13, 17, 3, 'fp32', layout='tokens'),
    Case(2, 40, 13, 17, 3, 'fp16'),
    Case(1, 72, 9, 11, 5, 'fp32', normalize=False, weight=False, bias=False),
    Case(1, 72, 9, 11, 5, 'fp16', layout='tokens'),
    Case(2, 6, 7, 5, 3, 'bf16', layout='tokens'),
    Case(1, 24, 1, 9, 3, 'fp32', weight=False),           # one row: H < K
    Case(1, 16, 4, 3, 7, 'fp32', bias=False, layout='tokens'),  # kernel larger than the grid
    Case(1, 8, 12, 12, 1, 'fp32', normalize=False),       # 1x1 kernel
    Case(2, 24, 6, 7, 3, 'fp32', kernel_dtype='bf16', layout='tokens'),
]


@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case) -> None:
    check_against_reference(case, backend='triton')


@needs_triton
@pytest.mark.parametrize('case', [Case(2, 40, 13, 17, 3, 'fp32', layout='tokens'),
                                  Case(1, 6, 15, 16, 5, 'fp16')], ids=lambda c: c.id)
def test_triton_backward_sums_several_tiles_per_program(monkeypatch, case: Case) -> None:
    """At the test sizes a program has one pixel tile; with the program floor lowered, each
    backward program sums the partial sums of up to 3 tiles (the last group partial: 4 tiles)."""
    from mmeffattn.ops.dynamic_dwconv import function
    monkeypatch.setattr(function, 'BWD_MIN_PROGRAMS', 1)
    monkeypatch.setattr(function, 'BWD_MAX_TILES_PER_PROG', 3)
    n_tiles = -(-case.H * case.W // function.BWD_TILE[1])
    assert n_tiles == 4 and function.bwd_tiles_per_prog(n_tiles, 1) == 3
    check_against_reference(case, backend='triton')


@needs_triton
def test_triton_keeps_the_token_layout() -> None:
    """A token tensor's channels-last view comes back in the same layout (no copy needed to
    return to tokens), NCHW stays NCHW."""
    for layout, channels_last in (('tokens', True), ('nchw', False)):
        x, kernel, bias, weight = make_inputs(Case(1, 16, 5, 6, 3, 'fp32', layout=layout))
        out = dynamic_dwconv(x, kernel, bias, weight, normalize=True, backend='triton')
        assert out.stride() == x.stride()
        assert out.flatten(2).transpose(1, 2).is_contiguous() == channels_last


def test_torch_keeps_one_samples_token_layout() -> None:
    """The torch backend convolves one sample's channels-last map as it is (oneDNN's channels-last
    path: no copy to NCHW in, tokens out without a copy), and matches the grouped form of two."""
    x, kernel, bias, weight = make_inputs(Case(2, 16, 5, 6, 3, 'fp32', layout='tokens'))
    out = dynamic_dwconv(x[:1], kernel[:1], bias, weight, normalize=True, backend='torch')
    assert out.stride() == x[:1].stride()
    both = dynamic_dwconv(x, kernel, bias, weight, normalize=True, backend='torch')
    torch.testing.assert_close(out, both[:1])


@needs_triton
def test_triton_zero_kernels_no_grad_and_partial_grad() -> None:
    """Zero predicted kernels (norm 0: torch's zero subgradient, no NaN); inference needs no
    saved tensors; gradients only for the inputs that require them; an expanded upstream
    gradient (``out.sum()``) works."""
    case = Case(2, 16, 6, 5, 3, 'fp32')
    x, kernel, bias, weight = make_inputs(case)
    kernel[:, ::3] = 0
    with torch.no_grad():
        out = dynamic_dwconv(x, kernel, bias, weight, normalize=True, backend='triton')
    ref = dynamic_dwconv_naive(*(t.double() for t in (x, kernel, bias, weight)), normalize=True)
    assert_close(out, ref, torch.float32, 'out')

    for requires in ([kernel], [x, weight], [bias]):
        ts = [t.detach().requires_grad_(any(t is r for r in requires))
              for t in (x, kernel, bias, weight)]
        dynamic_dwconv(*ts, normalize=True, backend='triton').sum().backward()
        ts64 = [t.detach().double().requires_grad_(t.requires_grad) for t in ts]
        dynamic_dwconv_naive(*ts64, normalize=True).sum().backward()
        for name, t, t64 in zip(['dx', 'dkernel', 'dbias', 'dweight'], ts, ts64):
            if t.requires_grad:
                assert_close(t.grad, t64.grad, torch.float32, name)
            else:
                assert t.grad is None


@needs_triton
@pytest.mark.parametrize('weight_shape', ['conv', 'flat'])
def test_triton_gradients_are_new_tensors(weight_shape: str) -> None:
    """The kernel's and the static kernel's gradients are new contiguous tensors in their
    inputs' shapes (``[B, C, K, K]``; ``[C, 1, K, K]`` or ``[C, K, K]``), not reshaped views of
    the reduction's buffers."""
    from mmeffattn.ops.dynamic_dwconv import function
    x, kernel, bias, weight = make_inputs(Case(1, 3, 5, 6, 3, 'fp32'))
    if weight_shape == 'flat':
        weight = weight.reshape(3, 3, 3)
    grads = function.dynamic_dwconv_bwd(torch.ones_like(x), x, kernel, weight, True, True)
    for name, g, t in zip(['dx', 'dkernel', 'dbias', 'dweight'], grads, (x, kernel, bias, weight)):
        assert g._base is None and g.is_contiguous(), name
        assert g.shape == t.shape, name


# ------------------------------------------------------------------------------------------
# the reference alone
# ------------------------------------------------------------------------------------------
def per_sample_oracle(x, kernel, bias, weight, normalize):
    """One sample at a time, its own kernel, as ``nn.Conv2d(groups=C)`` would."""
    B, C, H, W = x.shape
    K = kernel.shape[-1]
    outs = []
    for b in range(B):
        k = kernel[b]  # [C, K, K]
        if normalize:
            k = k / (k.flatten(1).norm(dim=1).view(C, 1, 1) + 1)
        if weight is not None:
            k = k + weight.reshape(C, K, K)
        outs.append(F.conv2d(x[b:b + 1], k.unsqueeze(1), bias, padding=K // 2, groups=C))
    return torch.cat(outs)


@pytest.mark.parametrize('case', [Case(3, 6, 7, 5, 3, 'fp32'),
                                  Case(2, 5, 4, 9, 5, 'fp32', normalize=False, bias=False),
                                  Case(1, 4, 2, 3, 7, 'fp32', weight=False, layout='tokens')],
                         ids=lambda c: c.id)
def test_reference_is_per_sample_conv(case: Case) -> None:
    x, kernel, bias, weight = (None if t is None else t.double()
                               for t in make_inputs(case, 'cpu'))
    out = dynamic_dwconv(x, kernel, bias, weight, normalize=case.normalize, backend='reference')
    assert_close(out, per_sample_oracle(x, kernel, bias, weight, case.normalize),
                 torch.float64, 'out')


def test_reference_gradcheck_fp64() -> None:
    x, kernel, bias, weight = (t.double().requires_grad_()
                               for t in make_inputs(Case(2, 3, 4, 5, 3, 'fp32'), 'cpu'))
    assert torch.autograd.gradcheck(
        lambda x, k, b, w: dynamic_dwconv_naive(x, k, b, w, normalize=True),
        (x, kernel, bias, weight), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_reference_low_precision(dtype: str) -> None:
    """The reference in low precision (the CPU path) stays within the dtype's tolerance of its
    float64 evaluation, forward and backward (fp32 bias and static kernel, as in the model)."""
    case = Case(2, 8, 9, 7, 3, dtype, bias=False, weight=False)
    check_against_reference(case, backend='reference', device='cpu')


def test_reference_mixed_dtypes_cast_to_x() -> None:
    """Outside autocast, a kernel/bias/weight of another dtype is cast to x's dtype."""
    x, kernel, bias, weight = make_inputs(Case(1, 4, 5, 5, 3, 'fp32', kernel_dtype='bf16'), 'cpu')
    out = dynamic_dwconv(x, kernel, bias.half(), weight, normalize=True, backend='reference')
    assert out.dtype == torch.float32


# ------------------------------------------------------------------------------------------
# reasons against the kernels
# ------------------------------------------------------------------------------------------
def small(dtype: str = 'fp32', device: str = 'cpu', K: int = 3):
    return make_inputs(Case(1, 8, 5, 6, K, dtype), device)


def test_kernel_size_reason() -> None:
    """Kernels wider than the compiled limit are a reason against the Triton kernels; bf16 is
    not (no tl.dot, so it runs interpreted too)."""
    big = small(K=dc_op.MAX_KERNEL_SIZE + 2)
    assert any('kernel size 11 > 9' in r
               for r in dc_op.dynamic_dwconv_triton_reasons(*big, interpret=True))
    assert dc_op.dynamic_dwconv_triton_reasons(*small('bf16'), interpret=True) == []


# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _bad_inputs():
    x, k = torch.zeros(2, 4, 5, 6), torch.zeros(2, 4, 3, 3)
    b, w = torch.zeros(4), torch.zeros(4, 1, 3, 3)
    return [
        ('x-rank', (x[0], k), {}, r'x must be \[B, C, H, W\] \(4 dims\).*transpose'),
        ('x-type', (x.numpy(), k), {}, r'x must be a torch.Tensor'),
        ('x-empty', (x[:, :, :0], k), {}, r'x must not be empty'),
        ('kernel-grouped', (x, k.reshape(8, 1, 3, 3)), {},
         r'kernel must be \[B, C, K, K\] = \[2, 4, K, K\].*\[B\*C, 1, K, K\]'),
        ('kernel-batch', (x, k[:1]), {}, r'kernel must be \[B, C, K, K\]'),
        ('kernel-not-square', (x, k[..., :2]), {}, r'kernel must be \[B, C, K, K\]'),
        ('kernel-even', (x, torch.zeros(2, 4, 2, 2)), {}, r'K=2 must be odd'),
        ('bias-shape', (x, k, torch.zeros(8)), {}, r'bias must be \[C\] = \[4\]'),
        ('weight-shape', (x, k, b, torch.zeros(4, 3, 3, 1)), {},
         r'weight \(the static kernel\) must be \[C, 1, K, K\] = \[4, 1, 3, 3\]'),
        ('normalize-int', (x, k), dict(normalize=1), r'normalize must be a bool'),
        ('int', (x.long(), k), {}, r'x must be floating point'),
        ('weight-int', (x, k, b, w.long()), {}, r'weight must be floating point'),
        ('device', (x, k.to('meta')), {}, r'one device.*kernel meta'),
    ]


@pytest.mark.parametrize('args,kwargs,match', [(a, kw, m) for _, a, kw, m in _bad_inputs()],
                         ids=[name for name, _, _, _ in _bad_inputs()])
def test_invalid_inputs(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        dynamic_dwconv(*args, **kwargs)

