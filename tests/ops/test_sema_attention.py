"""SEMA attention: Triton kernels (interpreted on CPU, compiled on CUDA) vs the PyTorch reference,
reference semantics, gradients, dispatch and input validation."""
import math
from typing import NamedTuple, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

from mmeffattn.ops import (_backend, sema_attention, sema_attention_naive, sema_attention_qk,
                          sema_attention_qk_naive)
from op_checks import DEVICE, DTYPES, HAS_CUDA, assert_close, needs_triton, rms

pytestmark = pytest.mark.usefixtures('one_thread')


class Case(NamedTuple):
    B: int
    heads: int
    H: int
    W: int
    window: int
    D: int
    dtype: str
    with_mean: bool = True
    scale: Optional[float] = None

    @property
    def id(self) -> str:
        s = f'B{self.B}-H{self.heads}-{self.H}x{self.W}-w{self.window}-D{self.D}-{self.dtype}'
        if not self.with_mean:
            s += '-nomean'
        if self.scale is not None:
            s += f'-scale{self.scale:g}'
        return s


def make_qkv(case: Case, device: str = DEVICE, seed: int = 0):
    """q, k, v ``[B, heads, N, D]`` in the case's dtype; v has a non-zero mean so the mean term
    is visible."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.B, case.heads, case.H * case.W, case.D)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    v = v + torch.randn((case.B, case.heads, 1, case.D), generator=g)
    dtype = DTYPES[case.dtype]
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v))


# Launch sizes: about 100 interpreted programs at most per kernel launch (the fp32 cases, whose
# interpreted dots cost most, use one batch and at most two heads). Together the cases
# cover partial windows in one or both directions, grids smaller than the window, exact
# multiples, windows of one token, one block per window (window <= 8) and several (window 12:
# 144 tokens), odd head dims and 16/128, with/without the mean, a custom scale.
TRITON_CASES = [
    Case(1, 2, 13, 17, 7, 40, 'fp32'),
    Case(2, 3, 13, 17, 7, 40, 'fp16'),          # batch and heads > 1
    Case(1, 2, 5, 9, 7, 24, 'fp32'),            # H < window
    Case(1, 2, 10, 4, 7, 24, 'fp16'),           # W < window
    Case(1, 2, 3, 4, 7, 72, 'fp16'),            # the whole grid is one (partial) window
    Case(1, 2, 14, 14, 7, 16, 'fp32'),          # exact multiple
    Case(1, 2, 14, 14, 7, 128, 'fp16'),
    Case(1, 1, 14, 21, 7, 128, 'fp32', with_mean=False),
    Case(2, 1, 9, 10, 4, 32, 'fp16', with_mean=False, scale=0.3),
    Case(1, 2, 16, 17, 8, 32, 'fp16'),          # 64-token windows
    Case(1, 2, 9, 11, 8, 72, 'fp32', scale=0.2),
    Case(1, 2, 3, 5, 1, 16, 'fp32'),            # one-token windows
    Case(1, 1, 13, 17, 12, 40, 'fp32'),         # 144-token windows: several blocks
    Case(1, 1, 25, 14, 12, 64, 'fp16', with_mean=False),
    Case(1, 1, 12, 12, 12, 128, 'fp16'),
]


def reference_fp64(q, k, v, case: Case):
    """The reference evaluated in float64 on the same (rounded) inputs, with input gradients."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = sema_attention_naive(q64, k64, v64, (case.H, case.W), case.window, scale=case.scale,
                               with_mean=case.with_mean)
    return out, (q64, k64, v64)


def check_against_reference(case: Case, backend: str, device: str = DEVICE) -> None:
    dtype = DTYPES[case.dtype]
    q, k, v = (x.requires_grad_() for x in make_qkv(case, device))
    out = sema_attention(q, k, v, (case.H, case.W), case.window, scale=case.scale,
                         with_mean=case.with_mean, backend=backend)
    assert out.dtype == dtype and out.shape == q.shape
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out.backward(do)

    ref, inputs64 = reference_fp64(q, k, v, case)
    ref.backward(do.double())
    assert_close(out, ref, dtype, 'out')
    for name, x, x64 in zip('qkv', (q, k, v), inputs64):
        assert_close(x.grad, x64.grad, dtype, f'd{name}')


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case) -> None:
    check_against_reference(case, backend='triton')


@pytest.mark.skipif(not _backend.HAS_TRITON, reason='needs Triton')
def test_triton_cases_cover_every_kernel() -> None:
    """The cases above launch every kernel (one-block and several-block windows) in fp32 and
    fp16, whatever tile table the launcher uses."""
    from mmeffattn.ops._launch import record_launches
    from mmeffattn.ops.sema import function
    seen = set()
    for case in TRITON_CASES:
        q, k, v = make_qkv(case, 'cpu')
        geom = function.window_geometry((case.H, case.W), case.window)
        with record_launches() as launches:
            o, lse, mean = function.sema_fwd(q, k, v, geom, 1., case.with_mean)
            function.sema_bwd(o, q, k, v, o, lse, mean, geom, 1., case.with_mean)
        seen |= {(case.dtype, launch.config.kernel.__name__) for launch in launches}
    kernels = {'sema_fwd_window_kernel', 'sema_bwd_window_kernel', 'sema_fwd_kernel',
               'softmax_bwd_delta_kernel', 'sema_bwd_kernel'}
    missing = {(dt, name) for dt in ('fp32', 'fp16') for name in kernels} - seen
    assert not missing, missing


@pytest.mark.skipif(not (HAS_CUDA and _backend.HAS_TRITON),
                    reason='bf16 tl.dot is wrong in Triton\'s interpreter: bf16 runs on CUDA only')
@pytest.mark.parametrize('case', [Case(2, 3, 13, 17, 7, 32, 'bf16'),
                                  Case(1, 2, 25, 14, 12, 64, 'bf16')], ids=lambda c: c.id)
def test_triton_matches_reference_bf16_cuda(case: Case) -> None:
    check_against_reference(case, backend='triton', device='cuda')


@needs_triton
def test_triton_strided_inputs() -> None:
    """Strided views of a fused qk projection and a transposed v, as the backbone passes them."""
    B, N, nh, D, hw = 1, 7 * 9, 2, 32, (7, 9)
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(B, N, 2, nh, D, generator=g).to(DEVICE).requires_grad_()
    v_tok = torch.randn(B, N, nh * D, generator=g).to(DEVICE).requires_grad_()
    q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, N, D], token stride 2*nh*D
    v = v_tok.reshape(B, N, nh, D).transpose(1, 2)
    assert not q.is_contiguous() and not v.is_contiguous()
    out = sema_attention(q, k, v, hw, 7, backend='triton')
    do = torch.randn(out.shape, generator=g).to(DEVICE)
    out.backward(do)

    qk64 = qk.detach().double().requires_grad_()
    v64 = v_tok.detach().double().requires_grad_()
    q64, k64 = qk64.permute(2, 0, 3, 1, 4).unbind(0)
    ref = sema_attention_naive(q64.contiguous(), k64.contiguous(),
                               v64.reshape(B, N, nh, D).transpose(1, 2).contiguous(), hw, 7)
    ref.backward(do.double())
    assert_close(out, ref, torch.float32, 'out')
    assert_close(qk.grad, qk64.grad, torch.float32, 'dqk')
    assert_close(v_tok.grad, v64.grad, torch.float32, 'dv')


@needs_triton
@pytest.mark.parametrize('case', [Case(2, 2, 9, 10, 7, 40, 'fp16'),  # one block per window
                                  Case(1, 2, 7, 9, 5, 40, 'fp32'),  # several (fp32: 16 tokens)
                                  Case(1, 2, 8, 8, 4, 24, 'fp32', with_mean=False),
                                  Case(1, 1, 9, 10, 9, 72, 'fp16', with_mean=False)],
                         ids=lambda c: c.id)
def test_triton_tokens_major_output(case: Case) -> None:
    """``out_layout='bnhd'`` with the backbone's strided inputs: the kernels store
    ``[B, N, heads, D]`` straight (contiguous), read its gradient in that layout, and return dv in
    v's layout; values and every gradient match the fp64 reference, one block per window and
    several, with and without the mean."""
    B, nh, N, D, hw = case.B, case.heads, case.H * case.W, case.D, (case.H, case.W)
    dtype = DTYPES[case.dtype]
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(B, N, 2, nh, D, generator=g).to(DEVICE, dtype).requires_grad_()
    v_tok = (torch.randn(B, N, nh, D, generator=g) + 1).to(DEVICE, dtype).requires_grad_()
    q, k = (t.transpose(1, 2) for t in qk.unbind(2))
    out = sema_attention(q, k, v_tok.transpose(1, 2), hw, case.window, with_mean=case.with_mean,
                         out_layout='bnhd', backend='triton')
    assert out.shape == (B, N, nh, D) and out.is_contiguous()
    do = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    out.backward(do)
    assert v_tok.grad.is_contiguous()  # dv came back in v's layout: its views' backward copied nothing

    qk64, v64 = (x.detach().double().requires_grad_() for x in (qk, v_tok))
    q64, k64 = (t.transpose(1, 2) for t in qk64.unbind(2))
    ref = sema_attention_naive(q64, k64, v64.transpose(1, 2), hw, case.window,
                               with_mean=case.with_mean)  # [B, nh, N, D]
    ref.transpose(1, 2).backward(do.double())
    assert_close(out, ref.transpose(1, 2), dtype, 'out')
    assert_close(qk.grad, qk64.grad, dtype, 'dqk')
    assert_close(v_tok.grad, v64.grad, dtype, 'dv')


def make_packed(case: Case, device: str = DEVICE, seed: int = 0):
    """qk ``[B, N, 2, heads, D]`` (a fused projection's output) and v ``[B, heads, N, D]`` (a
    transposed view of ``[B, N, heads, D]``, as the backbone passes it), leaves in the case's
    dtype; v has a non-zero mean."""
    B, nh, N, D = case.B, case.heads, case.H * case.W, case.D
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[case.dtype]
    qk = torch.randn(B, N, 2, nh, D, generator=g).to(device, dtype).requires_grad_()
    v_tok = (torch.randn(B, N, nh, D, generator=g) + torch.randn(B, 1, nh, D, generator=g))
    return qk, v_tok.to(device, dtype).requires_grad_()


@needs_triton
@pytest.mark.parametrize('out_layout', ['bnhd', 'bhnd'])
@pytest.mark.parametrize('case', [Case(2, 2, 9, 10, 7, 40, 'fp16'),  # one block, partial windows
                                  Case(1, 2, 7, 9, 5, 24, 'fp32'),  # several blocks (fp32)
                                  Case(1, 1, 5, 6, 4, 72, 'fp16', with_mean=False, scale=0.3),
                                  Case(1, 2, 6, 5, 4, 40, 'fp32', with_mean=False)],
                         ids=lambda c: c.id)
def test_triton_qk_matches_reference(case: Case, out_layout: str) -> None:
    """``sema_attention_qk`` on the Triton backend (q and k packed; dq and dk stored straight
    into one gradient for qk) against the fp64 reference on the unbound q and k: the output and
    the gradients of qk and v, one block per window and several, partial windows, head dims
    that are not powers of two, with and without the mean, both output layouts."""
    hw = (case.H, case.W)
    dtype = DTYPES[case.dtype]
    qk, v_tok = make_packed(case)
    out = sema_attention_qk(qk, v_tok.transpose(1, 2), hw, case.window, scale=case.scale,
                            with_mean=case.with_mean, out_layout=out_layout, backend='triton')
    assert out.dtype == dtype and out.is_contiguous()
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    out.backward(do)
    # the gradient the op returned for qk is the leaf's: packed, contiguous like qk
    assert qk.grad.is_contiguous() and v_tok.grad.is_contiguous()

    qk64, v64 = (x.detach().double().requires_grad_() for x in (qk, v_tok))
    q64, k64 = (t.transpose(1, 2) for t in qk64.unbind(2))
    ref = sema_attention_naive(q64, k64, v64.transpose(1, 2), hw, case.window, scale=case.scale,
                               with_mean=case.with_mean, out_layout=out_layout)
    ref.backward(do.double())
    assert_close(out, ref, dtype, 'out')
    assert_close(qk.grad, qk64.grad, dtype, 'dqk')
    assert_close(v_tok.grad, v64.grad, dtype, 'dv')


@needs_triton
def test_triton_qk_strided_and_partial_grad() -> None:
    """A packed qk that is a strided view (a slice of a wider projection: its gradient is
    allocated contiguous, qk's layout is not dense) and gradients only for v, or only for qk."""
    case = Case(1, 2, 5, 6, 4, 24, 'fp32')
    B, nh, N, D, hw = case.B, case.heads, case.H * case.W, case.D, (case.H, case.W)
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(B, N, 3 * nh * D, generator=g).to(DEVICE).requires_grad_()
    v = torch.randn(B, nh, N, D, generator=g).to(DEVICE).requires_grad_()
    qk = wide[..., :2 * nh * D].reshape(B, N, 2, nh, D)  # a view, token stride 3 * nh * D
    assert not qk.is_contiguous()
    out = sema_attention_qk(qk, v, hw, case.window, backend='triton')
    do = torch.randn(out.shape, generator=g).to(DEVICE)
    dwide, dv = torch.autograd.grad(out, (wide, v), do)

    wide64, v64 = (x.detach().double().requires_grad_() for x in (wide, v))
    ref = sema_attention_qk_naive(wide64[..., :2 * nh * D].reshape(B, N, 2, nh, D), v64, hw,
                                  case.window)
    ref_dwide, ref_dv = torch.autograd.grad(ref, (wide64, v64), do.double())
    assert_close(out, ref, torch.float32, 'out')
    assert_close(dwide, ref_dwide, torch.float32, 'dwide')
    assert_close(dv, ref_dv, torch.float32, 'dv')
    assert not dwide[..., 2 * nh * D:].any()  # the v third of the wide projection: no gradient

    out = sema_attention_qk(qk.detach(), v, hw, case.window, backend='triton')
    assert_close(torch.autograd.grad(out, v, do)[0], ref_dv, torch.float32, 'dv only')
    out = sema_attention_qk(qk, v.detach(), hw, case.window, backend='triton')
    assert_close(torch.autograd.grad(out, wide, do)[0], ref_dwide, torch.float32, 'dqk only')


# the mean returned instead of added (return_mean): partial windows, D < BD, one block per
# window and several (fp32's 16-token blocks; 144-token windows in fp16), one-token windows
RETURN_MEAN_CASES = [
    (Case(1, 2, 13, 17, 7, 40, 'fp32'), 'qk', 'bnhd'),
    (Case(2, 3, 13, 17, 7, 40, 'fp16'), 'qk', 'bnhd'),
    (Case(1, 2, 5, 9, 7, 24, 'fp32'), 'qkv', 'bhnd'),
    (Case(1, 2, 3, 4, 7, 72, 'fp16'), 'qkv', 'bnhd'),
    (Case(1, 1, 13, 17, 12, 40, 'fp32'), 'qk', 'bhnd'),
    (Case(1, 1, 12, 12, 12, 128, 'fp16'), 'qk', 'bnhd'),
    (Case(1, 2, 3, 5, 1, 16, 'fp32', scale=0.3), 'qkv', 'bhnd'),
]


def return_mean_call(case: Case, entry: str, out_layout: str, backend: str, qk, v_tok):
    """``(out, mean)`` of the op with ``return_mean=True`` through ``sema_attention_qk``
    (``entry='qk'``) or ``sema_attention`` on the unbound q, k (``'qkv'``)."""
    hw, v = (case.H, case.W), v_tok.transpose(1, 2)
    kw = dict(scale=case.scale, out_layout=out_layout, return_mean=True, backend=backend)
    if entry == 'qk':
        return sema_attention_qk(qk, v, hw, case.window, **kw)
    q, k = (t.transpose(1, 2) for t in qk.unbind(2))
    return sema_attention(q, k, v, hw, case.window, **kw)


@needs_triton
@pytest.mark.parametrize('case,entry,out_layout', RETURN_MEAN_CASES,
                         ids=[f'{c.id}-{e}-{layout}' for c, e, layout in RETURN_MEAN_CASES])
def test_triton_return_mean_matches_reference(case: Case, entry: str, out_layout: str) -> None:
    """``return_mean=True`` on Triton (the forward programs write the value partial sums, the
    backward reads the mean's gradient) against the fp64 reference: ``out`` without the mean,
    the mean ``[B, heads, D]`` in v's dtype, and the gradients of qk and v through both."""
    dtype = DTYPES[case.dtype]
    B, nh, D = case.B, case.heads, case.D
    qk, v_tok = make_packed(case)
    out, mean = return_mean_call(case, entry, out_layout, 'triton', qk, v_tok)
    assert out.dtype == mean.dtype == dtype and mean.shape == (B, nh, D)
    g = torch.Generator().manual_seed(1)
    do = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    dmean = torch.randn(mean.shape, generator=g).to(DEVICE, dtype)
    torch.autograd.backward((out, mean), (do, dmean))

    qk64, v64 = (x.detach().double().requires_grad_() for x in (qk, v_tok))
    ref, ref_mean = return_mean_call(case, entry, out_layout, 'reference', qk64, v64)
    torch.autograd.backward((ref, ref_mean), (do.double(), dmean.double()))
    assert_close(out, ref, dtype, 'out')
    assert_close(mean, ref_mean, dtype, 'mean')
    assert_close(qk.grad, qk64.grad, dtype, 'dqk')
    assert_close(v_tok.grad, v64.grad, dtype, 'dv')


@needs_triton
@pytest.mark.parametrize('case', [Case(1, 2, 9, 10, 4, 24, 'fp16'),  # one block per window
                                  Case(1, 2, 7, 9, 5, 24, 'fp32')],  # several (fp32)
                         ids=lambda c: c.id)
def test_triton_return_mean_one_output_used(case: Case) -> None:
    """Only ``out`` reaches the loss (the backward adds no mean term to dv), or only the mean
    (autograd gives the output no gradient; dq = dk = 0 and dv = dmean / N)."""
    dtype = DTYPES[case.dtype]
    qk, v_tok = make_packed(case)
    qk64, v64 = (x.detach().double().requires_grad_() for x in (qk, v_tok))
    g = torch.Generator().manual_seed(1)
    for used in (0, 1):
        out, mean = return_mean_call(case, 'qk', 'bnhd', 'triton', qk, v_tok)
        ref = return_mean_call(case, 'qk', 'bnhd', 'reference', qk64, v64)
        grad = torch.randn((out, mean)[used].shape, generator=g).to(DEVICE, dtype)
        got = torch.autograd.grad((out, mean)[used], (qk, v_tok), grad)
        # (the reference's mean does not depend on qk: a zero gradient)
        expected = torch.autograd.grad(ref[used], (qk64, v64), grad.double(),
                                       allow_unused=True, materialize_grads=True)
        assert_close(got[0], expected[0], dtype, f'dqk (output {used})')
        assert_close(got[1], expected[1], dtype, f'dv (output {used})')
    assert not got[0].any()  # only the mean used: no gradient for q and k
    N = case.H * case.W
    torch.testing.assert_close(got[1].float(), (grad.float() / N).unsqueeze(1).expand_as(got[1]),
                               rtol=1e-3, atol=1e-6)


@needs_triton
def test_return_mean_operator_opcheck() -> None:
    """``mmeffattn::sema_attention_qk`` and ``sema_attention`` with ``return_mean=True``:
    schema, fake implementation, autograd registration (the mean differentiable), with and
    without gradients; and ``torch.export`` of the public call holds one node."""
    import importlib
    importlib.import_module('mmeffattn.ops.sema.library')
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(1, 15, 2, 2, 16, generator=g).to(DEVICE)
    v = torch.randn(1, 2, 15, 16, generator=g).to(DEVICE)
    args = ([3, 5], 2, 0.25, True, 'ieee', 'bnhd', True)
    for grad in (False, True):
        x = [t.detach().requires_grad_(grad) for t in (qk, v)]
        torch.library.opcheck(torch.ops.mmeffattn.sema_attention_qk, (*x, *args))
        q, k = (t.transpose(1, 2) for t in x[0].unbind(2))
        torch.library.opcheck(torch.ops.mmeffattn.sema_attention, (q, k, x[1], *args))

    class Call(torch.nn.Module):
        def forward(self, qk, v):
            out, mean = sema_attention_qk(qk, v, (3, 5), 2, out_layout='bnhd',
                                          return_mean=True, backend='triton')
            return out, mean

    ep = torch.export.export(Call(), (qk, v))
    ours = [str(n.target) for n in ep.graph.nodes
            if n.op == 'call_function' and str(n.target).startswith('mmeffattn.')]
    assert ours == ['mmeffattn.sema_attention_qk.default'], ours
    for a, b in zip(ep.module()(qk, v), Call()(qk, v)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('out_layout', ['bnhd', 'bhnd'])
@pytest.mark.parametrize('case', [Case(1, 2, 9, 10, 4, 32, 'fp32'),
                                  Case(2, 1, 7, 7, 7, 16, 'fp16', with_mean=False)],
                         ids=lambda c: c.id)
def test_reference_qk_is_the_unbound_call(case: Case, out_layout: str) -> None:
    """The reference of ``sema_attention_qk`` is ``sema_attention``'s on the unbound q and k:
    the same values and gradients bit for bit, and the same data-moving aten calls forward and
    backward (the eager CPU path pays nothing for the packed entry point)."""
    hw = (case.H, case.W)
    qk, v_tok = make_packed(case, 'cpu')

    def run(packed: bool):
        v = v_tok.transpose(1, 2)
        if packed:
            out = sema_attention_qk(qk, v, hw, case.window, with_mean=case.with_mean,
                                    out_layout=out_layout, backend='reference')
        else:
            q, k = (t.transpose(1, 2) for t in qk.unbind(2))
            out = sema_attention(q, k, v, hw, case.window, with_mean=case.with_mean,
                                 out_layout=out_layout, backend='reference')
        return (out, *torch.autograd.grad(out, (qk, v_tok), torch.ones_like(out)))

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert glue_calls(lambda: run(True)) == glue_calls(lambda: run(False))


@pytest.mark.parametrize('case', [Case(2, 3, 13, 17, 7, 40, 'fp32'),
                                  Case(1, 2, 14, 14, 7, 16, 'fp32', with_mean=False),
                                  Case(1, 2, 9, 10, 4, 32, 'fp16')], ids=lambda c: c.id)
@pytest.mark.parametrize('backend', ['torch', 'reference'])
def test_pytorch_tokens_major_output(case: Case, backend: str) -> None:
    """``out_layout='bnhd'`` (on the torch backend, windows merged straight into
    ``[B, N, heads, D]``) is the ``'bhnd'`` result transposed, forward and backward, padded
    grids or not."""
    q, k, v = (x.requires_grad_() for x in make_qkv(case, 'cpu'))
    hw = (case.H, case.W)
    out = sema_attention(q, k, v, hw, case.window, with_mean=case.with_mean, out_layout='bnhd',
                         backend=backend)
    assert out.shape == (case.B, case.H * case.W, case.heads, case.D) and out.is_contiguous()
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref = sema_attention(q, k, v, hw, case.window, with_mean=case.with_mean,
                         backend=backend)
    ref_grads = torch.autograd.grad(ref, (q, k, v), do.transpose(1, 2))
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=0)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


#: aten calls that move no data (allocations, views): not glue passes
_NO_DATA_OPS = frozenset(f'aten::{n}' for n in (
    'empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided', 'view', 'reshape',
    '_unsafe_view', '_reshape_alias', 'as_strided', 'transpose', 'permute', 'unbind', 'select',
    'slice', 'expand', 'unsqueeze', 'squeeze', 'split', 'chunk', 'narrow', 't', 'detach',
    'alias', 'set_', 'to', 'contiguous', 'lift_fresh', 'result_type', 'unflatten', 'flatten'))


def glue_calls(fn, shapes: bool = False) -> list:
    """The data-moving aten calls (copies, reductions, elementwise, fills) that ``fn()`` makes
    outside the kernels, outermost only (a ``clone`` inside ``reshape`` counts once, its
    ``copy_`` not again), profiled on the CPU; the interpreter's emulation of the kernels (under
    ``_launch.INTERPRETED_LAUNCH``) is left out. ``shapes``: ``(name, shape of the first
    input)`` pairs instead of names."""
    from torch.profiler import ProfilerActivity, profile
    from mmeffattn.ops._launch import INTERPRETED_LAUNCH

    def counted(event) -> bool:
        if not event.name.startswith('aten::') or event.name in _NO_DATA_OPS:
            return False
        parent = event.cpu_parent
        while parent is not None:
            if parent.name == INTERPRETED_LAUNCH or (parent.name.startswith('aten::') and
                                                     parent.name not in _NO_DATA_OPS):
                return False
            parent = parent.cpu_parent
        return True

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
        fn()
    if shapes:
        return sorted((e.name, tuple(e.input_shapes[0]) if e.input_shapes else ())
                      for e in prof.events() if counted(e))
    return sorted(e.name for e in prof.events() if counted(e))


def _glue_inputs(B: int, N: int, C: int, dtype: str) -> Tuple[torch.Tensor, ...]:
    """Seeded ``(qk_tok [B, N, 2C], v_tok [B, N, C], do [B, N, C])`` projection outputs (leaves
    with gradients) and an output gradient, as the backbone's tokens."""
    g = torch.Generator().manual_seed(0)
    qk_tok = torch.randn(B, N, 2 * C, generator=g).to(DTYPES[dtype]).requires_grad_()
    v_tok = torch.randn(B, N, C, generator=g).to(DTYPES[dtype]).requires_grad_()
    return qk_tok, v_tok, torch.randn(B, N, C, generator=g).to(DTYPES[dtype])


@pytest.mark.skipif(not _backend.TRITON_INTERPRET or not _backend.HAS_TRITON,
                    reason='counts the glue around the interpreted kernels on the CPU')
@pytest.mark.parametrize('dtype,window,with_mean', [('fp16', 4, True), ('fp32', 7, True),
                                                    ('fp16', 4, False)],
                         ids=['one-block', 'several-blocks', 'one-block-nomean'])
def test_triton_glue_call_count(dtype: str, window: int, with_mean: bool) -> None:
    """Forward + backward with the backbone's views (packed qk, v a view, tokens-major output)
    and the mean added by the op (the default) or absent (the ``'window'`` mixer) makes only
    the calls the design needs around the kernels. With the mean: forward ``sum`` of the
    windows' partial value sums and ``add_`` of the mean to the output (the kernels never add
    it); backward ``sum`` of dO, the mean's gradient (the kernels add it to dv over N). q and
    k unbound and given to ``sema_attention`` add autograd's ``stack`` of dq and dk."""
    B, nh, D, (H, W) = 1, 2, 16, (5, 6)
    N, C = H * W, nh * D
    qk_tok, v_tok, do = _glue_inputs(B, N, C, dtype)

    def step(packed: bool) -> None:
        qk = qk_tok.reshape(B, N, 2, nh, D)
        v = v_tok.reshape(B, N, nh, D).transpose(1, 2)
        if packed:
            out = sema_attention_qk(qk, v, (H, W), window, with_mean=with_mean,
                                    out_layout='bnhd', backend='triton')
        else:
            q, k = (t.transpose(1, 2) for t in qk.unbind(2))
            out = sema_attention(q, k, v, (H, W), window, with_mean=with_mean,
                                 out_layout='bnhd', backend='triton')
        out.reshape(B, N, C).backward(do)

    mean_calls = ['aten::add_', 'aten::sum', 'aten::sum'] if with_mean else []
    grads = {}
    for packed in (True, False):
        step(packed)  # first call: compilation and caches outside the profile
        qk_tok.grad = v_tok.grad = None  # (accumulating into existing grads would add an add_)
        calls = glue_calls(lambda: step(packed))
        assert calls == sorted(mean_calls + ([] if packed else ['aten::stack']))
        grads[packed] = qk_tok.grad, v_tok.grad
        assert qk_tok.grad.shape == qk_tok.shape and v_tok.grad.shape == v_tok.shape
        qk_tok.grad = v_tok.grad = None
    for a, b in zip(grads[True], grads[False]):  # the same kernels, stored elsewhere
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(not _backend.TRITON_INTERPRET or not _backend.HAS_TRITON,
                    reason='counts the glue around the interpreted kernels on the CPU')
@pytest.mark.parametrize('dtype,window', [('fp16', 4), ('fp32', 4), ('fp32', 7)],
                         ids=['one-block', 'one-block-fp32', 'several-blocks'])
def test_triton_glue_call_count_mean_returned(dtype: str, window: int) -> None:
    """The backbone's call with the mean returned (``SEMAttention.forward``: the op with
    ``return_mean=True``, its mean joining the LePE convolution's bias, whose bias gradient is
    the mean's gradient) makes no reduction over an N-sized tensor. What remains:

    * forward, ``sum`` over the windows' partial value sums ``[B, heads, n_win * n_blocks,
      D]`` (fp32, about window_tokens x smaller than v), and in 16-bit dtypes the ``_to_copy`` of
      the ``[B, heads, D]`` mean to v's dtype;
    * backward, nothing: the kernels read the mean's gradient as given.

    Against the op adding the mean (``test_triton_glue_call_count``): the ``add_`` to the
    output and the ``sum`` over dO are gone. The gradients equal that call's when the mean's
    gradient is its output gradient's token sum."""
    B, nh, D, (H, W) = 2, 2, 16, (5, 6)
    N, C = H * W, nh * D
    qk_tok, v_tok, do = _glue_inputs(B, N, C, dtype)
    dmean = do.float().sum(dim=1).to(do.dtype).reshape(B, nh, D)  # as the conv's bias gradient

    def step(return_mean: bool) -> None:
        qk = qk_tok.reshape(B, N, 2, nh, D)
        v = v_tok.reshape(B, N, nh, D).transpose(1, 2)
        if return_mean:
            out, mean = sema_attention_qk(qk, v, (H, W), window, out_layout='bnhd',
                                          return_mean=True, backend='triton')
            torch.autograd.backward((out.reshape(B, N, C), mean), (do, dmean))
        else:
            out = sema_attention_qk(qk, v, (H, W), window, out_layout='bnhd', backend='triton')
            out.reshape(B, N, C).backward(do)

    from mmeffattn.ops.sema.function import sema_kernel_configs, window_geometry
    geom = window_geometry((H, W), window)
    n_blocks, _ = sema_kernel_configs(D, geom.window_tokens, DTYPES[dtype], True)
    n_parts = geom.n_win * n_blocks
    expected = [('aten::sum', (B, nh, n_parts, D))]
    if dtype != 'fp32':
        expected.append(('aten::_to_copy', (B, nh, D)))
    grads = {}
    for return_mean in (True, False):
        step(return_mean)  # first call: compilation and caches outside the profile
        qk_tok.grad = v_tok.grad = None  # (accumulating into existing grads would add an add_)
        calls = glue_calls(lambda: step(return_mean), shapes=True)
        if return_mean:
            assert calls == sorted(expected)
            assert all(math.prod(shape) < N * D for _, shape in calls)  # nothing N-sized
        else:
            assert [name for name, _ in calls] == ['aten::add_', 'aten::sum', 'aten::sum']
        grads[return_mean] = qk_tok.grad, v_tok.grad
        qk_tok.grad = v_tok.grad = None
    for name, a, b in zip(('dqk', 'dv'), grads[True], grads[False]):
        assert_close(a, b.double(), DTYPES[dtype], name)


@needs_triton
def test_triton_no_grad_and_partial_grad() -> None:
    """Inference mode needs no saved tensors; gradients only for the inputs that require them."""
    case = Case(1, 2, 9, 8, 7, 32, 'fp32')
    q, k, v = make_qkv(case)
    with torch.no_grad():
        out = sema_attention(q, k, v, (case.H, case.W), case.window, backend='triton')
    ref, _ = reference_fp64(q, k, v, case)
    assert_close(out, ref, torch.float32, 'out')

    v.requires_grad_()
    out = sema_attention(q, k, v, (case.H, case.W), case.window, backend='triton')
    out.sum().backward()
    assert q.grad is None and k.grad is None
    ref, (_, _, v64) = reference_fp64(q, k, v, case)
    ref.sum().backward()
    assert_close(v.grad, v64.grad, torch.float32, 'dv')


@needs_triton
@pytest.mark.parametrize('window', [7, 12], ids=['w7', 'w12'])
def test_triton_very_negative_logits(window: int) -> None:
    """Every logit of every row far below zero (log-sum-exp < -128 in log2 units, where
    exp2(0 - lse) overflows fp32) must still give finite, correct results on padded grids.
    Logits near -100 carry fp32 rounding of ~1e-5 absolute, which the softmax gradient turns
    into ~1e-4 relative error: the check is looser than the fp32 tolerance."""
    case = Case(1, 2, 9, 13, window, 32, 'fp32', scale=1.)
    q, k, v = make_qkv(case)
    direction = torch.randn(case.D, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    k = direction.div(case.D ** 0.5).mul(12.).expand_as(k) + 0.01 * k
    q = (-k.mean(dim=2, keepdim=True)).expand_as(q).contiguous() + 0.01 * q
    assert (q @ k.transpose(-1, -2)).max() < -100  # logits, with scale 1
    q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))
    out = sema_attention(q, k, v, (case.H, case.W), window, scale=1., backend='triton')
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out.backward(do)
    ref, inputs64 = reference_fp64(q, k, v, case)
    ref.backward(do.double())
    for name, x, x64 in zip(['out', 'dq', 'dk', 'dv'], (out, q.grad, k.grad, v.grad),
                            (ref, *(t.grad for t in inputs64))):
        assert torch.isfinite(x).all(), f'{name}: non-finite values'
        err = rms(x.double().cpu() - x64.detach().cpu()) / rms(x64.detach())
        assert err < 1e-3, f'{name}: relative RMS error {err:.2e}'


# ------------------------------------------------------------------------------------------
# the reference alone
# ------------------------------------------------------------------------------------------
def softmax_attention(q, k, v, scale):
    """Plain softmax attention over the last two dims, written out."""
    return torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1) @ v


def windows_by_slicing(q, k, v, hw, window, scale, with_mean=True):
    """SEMA attention by looping over the windows of the grid and slicing them (no padding)."""
    B, nh, N, D = q.shape
    H, W = hw
    grid = [x.reshape(B, nh, H, W, D) for x in (q, k, v)]
    out = torch.empty(B, nh, H, W, D, dtype=q.dtype)
    for r0 in range(0, H, window):
        for c0 in range(0, W, window):
            qw, kw, vw = (x[:, :, r0:r0 + window, c0:c0 + window].reshape(B, nh, -1, D)
                          for x in grid)
            o = softmax_attention(qw, kw, vw, scale)
            out[:, :, r0:r0 + window, c0:c0 + window] = o.reshape(
                B, nh, min(window, H - r0), min(window, W - c0), D)
    out = out.reshape(B, nh, N, D)
    return out + v.mean(dim=2, keepdim=True) if with_mean else out


@pytest.mark.parametrize('case', [
    Case(2, 2, 13, 17, 7, 24, 'fp32'), Case(1, 3, 5, 9, 7, 16, 'fp32'),
    Case(1, 2, 14, 14, 7, 32, 'fp32', scale=0.7), Case(1, 1, 6, 11, 4, 16, 'fp32'),
    Case(1, 1, 3, 3, 1, 16, 'fp32'), Case(1, 1, 25, 13, 12, 40, 'fp32', with_mean=False),
], ids=lambda c: c.id)
def test_reference_equals_window_slicing(case: Case) -> None:
    q, k, v = (x.double() for x in make_qkv(case, 'cpu'))
    scale = case.D ** -0.5 if case.scale is None else case.scale
    expected = windows_by_slicing(q, k, v, (case.H, case.W), case.window, scale, case.with_mean)
    out = sema_attention(q, k, v, (case.H, case.W), case.window, scale=case.scale,
                         with_mean=case.with_mean, backend='reference')
    assert_close(out, expected, torch.float64, 'out')


@pytest.mark.parametrize('dtype,train,fused', [('fp32', False, True), ('fp32', True, True),
                                               ('bf16', False, True), ('bf16', True, False)],
                         ids=['fp32-inference', 'fp32-training', 'bf16-inference',
                              'bf16-training'])
def test_torch_backend_kernel_on_a_partial_grid(dtype: str, train: bool, fused: bool) -> None:
    """The torch backend on a grid its windows do not tile (13 x 17, window 7): the partial
    windows are attended on their own, so no key is padded or masked. fp32, and bf16 without
    a gradient, run torch's fused CPU attention; bf16 training the plain matmul + softmax
    (the fused bf16 backward was 4x slower). All give the windows-by-slicing result."""
    case = Case(1, 2, 13, 17, 7, 32, dtype)
    q, k, v = (x.requires_grad_(train) for x in make_qkv(case, 'cpu'))
    with torch.profiler.profile() as prof:
        out = sema_attention(q, k, v, (13, 17), 7, backend='torch')
    names = {e.key for e in prof.key_averages()}
    assert ('aten::_scaled_dot_product_flash_attention_for_cpu' in names) == fused, sorted(names)
    assert ('aten::_softmax' in names) != fused, sorted(names)
    assert not names & {'aten::constant_pad_nd', 'aten::masked_fill', 'aten::masked_fill_'}
    expected = windows_by_slicing(*(x.detach().double() for x in (q, k, v)), (13, 17), 7,
                                  32 ** -0.5)
    assert_close(out.detach().double(), expected, DTYPES[dtype], 'out')


@pytest.mark.parametrize('hw,regions', [((13, 17), 4), ((14, 17), 2), ((14, 14), 1)],
                         ids=['partial-both', 'partial-w', 'exact'])
@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
def test_torch_backend_glue(hw, regions: int, dtype: str) -> None:
    """What the backbone calls (packed qk, tokens-major output, mean returned), without a
    gradient: per rectangle of equal windows one copy of each of q, k, v into windows and one
    copy back; one pass over v for the mean; nothing padded, masked or transposed besides."""
    C, nh = 64, 2
    g = torch.Generator().manual_seed(0)
    N = hw[0] * hw[1]
    qk = torch.randn(1, N, 2, nh, C // nh, generator=g).to(DTYPES[dtype])
    v = torch.randn(1, N, C, generator=g).to(DTYPES[dtype]).view(1, N, nh, -1).transpose(1, 2)
    with torch.no_grad():
        calls = glue_calls(lambda: sema_attention_qk(qk, v, hw, 7, out_layout='bnhd',
                                                     return_mean=True, backend='torch'))
    # the mean: one pass over v (bf16: sum / N, as mean() would copy v to fp32 first)
    reduce = ['aten::mean'] if dtype == 'fp32' else ['aten::sum', 'aten::div']
    assert calls == sorted(['aten::clone'] * 3 * regions + ['aten::copy_'] * regions
                           + ['aten::scaled_dot_product_attention'] * regions + reduce), calls


def test_torch_backend_backward_is_one_pass_per_tensor() -> None:
    """The torch backend's backward on a partial grid (four rectangles of windows): each
    rectangle's gradient is written into one tensor, not sliced back (a slice's backward
    zero-fills the whole grid, once per rectangle and tensor); it matches the reference."""
    case = Case(1, 2, 13, 17, 7, 32, 'fp32')
    q, k, v = (x.requires_grad_() for x in make_qkv(case, 'cpu'))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile() as prof:
        grads = torch.autograd.grad(sema_attention(q, k, v, (13, 17), 7, backend='torch'),
                                    (q, k, v), do)
    names = {e.key for e in prof.key_averages()}
    assert 'aten::slice_backward' not in names, sorted(names)
    assert not any('CopySlices' in n for n in names), sorted(names)  # (a copy into a slice)
    ref = torch.autograd.grad(sema_attention(q, k, v, (13, 17), 7, backend='reference'),
                              (q, k, v), do)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('backend', ['torch', 'reference'])
def test_pytorch_fp16_logits_past_the_fp16_range(backend: str) -> None:
    """fp16 inputs whose logits exceed 65504 (fp16's largest value): both PyTorch backends compute
    them in fp32, as the kernels do, and match float64 instead of giving NaN rows."""
    case = Case(1, 2, 9, 10, 7, 32, 'fp32', with_mean=False)
    q, k, v = make_qkv(case, 'cpu')
    q, k = (q * 130).half(), (k * 130).half()
    q[0, 0, 0] = 1.5 * k[0, 0, 5]  # one logit near 1.6e5
    out = sema_attention(q, k, v.half(), (9, 10), 7, with_mean=False, backend=backend)
    expected = sema_attention(q.double(), k.double(), v.half().double(), (9, 10), 7,
                              with_mean=False, backend='reference')
    assert torch.isfinite(out).all()
    assert_close(out, expected, torch.float16, 'out')


def test_reference_one_window_is_plain_attention() -> None:
    """A grid that is exactly one window, without the mean, is plain softmax attention; that also
    matches torch's scaled_dot_product_attention."""
    case = Case(2, 3, 7, 7, 7, 32, 'fp32', with_mean=False)
    q, k, v = (x.double() for x in make_qkv(case, 'cpu'))
    out = sema_attention(q, k, v, (7, 7), 7, with_mean=False, backend='reference')
    assert_close(out, softmax_attention(q, k, v, 32 ** -0.5), torch.float64, 'out')
    assert_close(out, F.scaled_dot_product_attention(q, k, v), torch.float64, 'out vs sdpa')
    # a window larger than the grid is the same single window (padded keys are masked out)
    out_big = sema_attention(q, k, v, (7, 7), 12, with_mean=False, backend='reference')
    assert_close(out_big, out, torch.float64, 'out, window 12')


def test_reference_mean_term() -> None:
    case = Case(2, 2, 13, 17, 7, 24, 'fp32')
    q, k, v = (x.double() for x in make_qkv(case, 'cpu'))
    kw = dict(backend='reference')
    diff = (sema_attention(q, k, v, (13, 17), 7, with_mean=True, **kw)
            - sema_attention(q, k, v, (13, 17), 7, with_mean=False, **kw))
    expected = v.mean(dim=2, keepdim=True).expand_as(diff)
    assert_close(diff, expected, torch.float64, 'mean term')
    assert expected.abs().max() > 0.1  # the test inputs have a visible mean


@pytest.mark.parametrize('out_layout', ['bhnd', 'bnhd'])
@pytest.mark.parametrize('hw', [(13, 17), (14, 14)], ids=['partial', 'exact'])
def test_reference_return_mean_is_the_mean_apart(out_layout: str, hw) -> None:
    """``return_mean=True`` returns the windowed attention alone and ``v.mean`` over the tokens
    ``[B, heads, D]``; their broadcast sum is the default result (float64, up to rounding)."""
    case = Case(2, 2, *hw, 7, 24, 'fp32')
    q, k, v = (x.double() for x in make_qkv(case, 'cpu'))
    kw = dict(out_layout=out_layout, backend='reference')
    out, mean = sema_attention(q, k, v, hw, 7, return_mean=True, **kw)
    assert mean.shape == (2, 2, 24)
    assert_close(mean, v.mean(dim=2), torch.float64, 'mean')
    assert_close(out, sema_attention(q, k, v, hw, 7, with_mean=False, **kw), torch.float64,
                 'out')
    tokens = 1 if out_layout == 'bnhd' else 2  # the token dim of the output layout
    full = out + (mean.unsqueeze(1) if out_layout == 'bnhd' else mean.unsqueeze(2))
    assert full.shape == out.shape and out.shape[tokens] == hw[0] * hw[1]
    assert_close(full, sema_attention(q, k, v, hw, 7, **kw), torch.float64, 'out + mean')


def test_torch_backend_return_mean_symbolic_path() -> None:
    """The torch backend's gather path (a symbolic grid under torch.export) returns the mean apart
    too: exported with a dynamic grid, it gives the eager ``(out, mean)``."""
    class Call(torch.nn.Module):
        def forward(self, q, k, v):
            H = q.shape[2] // 6
            return sema_attention(q, k, v, (H, 6), 4, out_layout='bnhd', return_mean=True,
                                  backend='reference')

    q, k, v = make_qkv(Case(1, 2, 5, 6, 4, 16, 'fp32'), 'cpu')
    n = torch.export.Dim('n', min=2, max=100)
    ep = torch.export.export(Call(), (q, k, v), dynamic_shapes=({2: 6 * n}, {2: 6 * n},
                                                                 {2: 6 * n}))
    q, k, v = make_qkv(Case(1, 2, 9, 6, 4, 16, 'fp32'), 'cpu', seed=3)
    for a, b in zip(ep.module()(q, k, v), Call()(q, k, v)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('dtype', ['fp16', 'bf16', 'fp32'])
def test_reference_low_precision(dtype: str) -> None:
    """The reference in low precision (the CPU path of fp16/bf16 models) stays within the dtype's
    tolerance of its float64 evaluation, forward and backward."""
    check_against_reference(Case(1, 2, 13, 17, 7, 32, dtype), backend='reference', device='cpu')


@pytest.mark.parametrize('backend', [pytest.param('triton', marks=needs_triton), 'reference'])
@pytest.mark.parametrize('entry,with_mean,return_mean', [
    ('sema_attention', True, False), ('sema_attention', False, False),
    ('sema_attention', True, True), ('sema_attention_qk', True, False)],
    ids=['mean', 'nomean', 'return-mean', 'qk'])
def test_autocast_is_not_followed(backend: str, entry: str, with_mean: bool,
                                  return_mean: bool) -> None:
    """Under ``torch.autocast`` both backends compute and return the inputs' dtype, exactly as
    without it: the kernels cannot follow autocast, so the reference turns it off (it gave bf16,
    or fp32 through the mean's promotion, from a bf16 computation)."""
    case = Case(1, 2, 5, 6, 4, 16, 'fp32')
    q, k, v = make_qkv(case)
    qk = torch.stack((q, k), dim=2).transpose(1, 3)  # [B, N, 2, heads, D]

    def run(autocast: bool):
        leaves = [x.clone().requires_grad_() for x in (qk, v)]
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            if entry == 'sema_attention_qk':
                res = sema_attention_qk(*leaves, (case.H, case.W), case.window,
                                        with_mean=with_mean, backend=backend)
            else:
                res = sema_attention(*(t.transpose(1, 2) for t in leaves[0].unbind(2)),
                                     leaves[1], (case.H, case.W), case.window,
                                     with_mean=with_mean, return_mean=return_mean,
                                     backend=backend)
        res = res if isinstance(res, tuple) else (res, )
        sum(t.square().sum() for t in res).backward()  # (outside autocast, as AMP does)
        return [t.detach() for t in res] + [x.grad for x in leaves]

    expected, got = run(False), run(True)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == torch.float32, i
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f'tensor {i}')


@pytest.mark.parametrize('with_mean,return_mean', [(True, False), (False, False), (True, True)],
                         ids=['mean', 'nomean', 'return-mean'])
def test_reference_gradcheck_fp64(with_mean: bool, return_mean: bool) -> None:
    # partial windows in both directions; the reference accepts any head dim (4 keeps it fast)
    case = Case(1, 2, 4, 5, 3, 4, 'fp32', scale=0.6)
    q, k, v = (x.double().requires_grad_() for x in make_qkv(case, 'cpu'))
    assert torch.autograd.gradcheck(
        lambda q, k, v: sema_attention_naive(q, k, v, (4, 5), 3, scale=0.6, with_mean=with_mean,
                                             return_mean=return_mean),
        (q, k, v), eps=1e-6, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------
def small_qkv(dtype=torch.float32, device='cpu'):
    """q, k, v ``[1, 2, 30, 16]`` on a 5x6 grid (window 4 pads both directions)."""
    return tuple(x.to(dtype) for x in make_qkv(Case(1, 2, 5, 6, 4, 16, 'fp32'), device))


# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _bad_inputs():
    x = torch.zeros(1, 2, 30, 16)
    return [
        ('rank', (x[0], x, x, (5, 6), 4), r'q must be \[B, heads, N, D\] \(4 dims\)'),
        ('shape', (x, x[:, :1], x, (5, 6), 4), r'same shape'),
        ('tokens', (x, x, x, (5, 5), 4), r'N=30 tokens but hw=\(5, 5\) holds H\*W=25'),
        ('hw-type', (x, x, x, 30, 4), r'hw must be a pair of positive ints'),
        ('hw-zero', (x, x, x, (0, 30), 4), r'hw must be a pair of positive ints'),
        ('window-0', (x, x, x, (5, 6), 0), r'window_size must be an int >= 1'),
        ('window-float', (x, x, x, (5, 6), 7.0), r'window_size must be an int >= 1'),
        ('head-dim-8', (torch.zeros(1, 2, 30, 8),) * 3 + ((5, 6), 4),
         r'head dim D=8 is outside the supported 16..128'),
        ('head-dim-160', (torch.zeros(1, 2, 30, 160),) * 3 + ((5, 6), 4), r'D=160'),
        ('dtype', (x, x.half(), x, (5, 6), 4), r'same dtype.*cast them'),
        ('int', (x.long(),) * 3 + ((5, 6), 4), r'floating point'),
        ('device', (x, x.to('meta'), x, (5, 6), 4), r'one device'),
        ('empty-batch', (torch.zeros(0, 2, 30, 16),) * 3 + ((5, 6), 4),
         r'q, k, v must not be empty, got shape \(0, 2, 30, 16\).*every dim must be at least 1'),
    ]


def test_invalid_out_layout() -> None:
    x = torch.zeros(1, 2, 30, 16)
    with pytest.raises(ValueError, match=r"out_layout must be one of \('bhnd', 'bnhd'\)"):
        sema_attention(x, x, x, (5, 6), 4, out_layout='bnc')


@pytest.mark.parametrize('kwargs,match', [
    (dict(return_mean=True, with_mean=False), r'return_mean=True .* needs with_mean=True'),
    (dict(return_mean=1), r'return_mean must be True or False, got 1'),
    (dict(return_mean=None), r'return_mean must be True or False'),
    (dict(with_mean='no'), r"with_mean must be True or False, got 'no'")],
    ids=['without-mean', 'int', 'none', 'with-mean-str'])
def test_invalid_return_mean(kwargs, match) -> None:
    x, qk = torch.zeros(1, 2, 30, 16), torch.zeros(1, 30, 2, 2, 16)
    with pytest.raises(ValueError, match=f'sema_attention: {match}'):
        sema_attention(x, x, x, (5, 6), 4, **kwargs)
    with pytest.raises(ValueError, match=f'sema_attention_qk: {match}'):
        sema_attention_qk(qk, x, (5, 6), 4, **kwargs)


@pytest.mark.parametrize('args,match', [(a, m) for _, a, m in _bad_inputs()],
                         ids=[name for name, _, _ in _bad_inputs()])
def test_invalid_inputs(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        sema_attention(*args)


def _bad_qk_inputs():
    qk, v = torch.zeros(1, 30, 2, 2, 16), torch.zeros(1, 2, 30, 16)
    return [
        ('qk-rank', (qk[0], v, (5, 6), 4), r'qk must be \[B, N, 2, heads, D\] \(5 dims\)'),
        ('qk-three', (torch.zeros(1, 30, 3, 2, 16), v, (5, 6), 4),
         r'qk must be \[B, N, 2, heads, D\] \(queries then keys'),
        ('v-rank', (qk, v[0], (5, 6), 4), r'v must be \[B, heads, N, D\] \(4 dims\)'),
        ('v-tokens-major', (qk, v.transpose(1, 2), (5, 6), 4),
         r'v must be \[B, heads, N, D\] = \(1, 2, 30, 16\) to match qk'),
        ('tokens', (qk, v, (5, 5), 4), r'sema_attention_qk: q has N=30 tokens'),
        ('dtype', (qk, v.half(), (5, 6), 4), r'sema_attention_qk: qk and v .*same dtype'),
        ('int', (qk.long(), v, (5, 6), 4), r'sema_attention_qk: qk must be floating point'),
        ('head-dim', (torch.zeros(1, 30, 2, 2, 8), torch.zeros(1, 2, 30, 8), (5, 6), 4),
         r'sema_attention_qk: head dim D=8'),
        ('out-layout', (qk, v, (5, 6), 4, 'bnc'), r'sema_attention_qk: out_layout'),
    ]


@pytest.mark.parametrize('args,match', [(a, m) for _, a, m in _bad_qk_inputs()],
                         ids=[name for name, _, _ in _bad_qk_inputs()])
def test_invalid_qk_inputs(args, match) -> None:
    *args, = args
    kwargs = dict(out_layout=args.pop()) if len(args) == 5 else {}
    with pytest.raises(ValueError, match=match):
        sema_attention_qk(*args, **kwargs)

