"""The ops' NaN contract, on every backend alike: the reference, the torch backend and Triton
(interpreted on the CPU).

Every public op documents it: a NaN in an input element makes exactly the outputs that depend
on that element NaN and leaves every other output unchanged; an inf follows IEEE arithmetic
through the op's formula (a dependent output is non-finite or the formula's limit, e.g.
``exp(-inf) = 0``), identically on every backend, and never changes an output that does not
depend on it. "Depends" is measured here: the outputs of the float64 reference that change when
the element changes. Float arguments (scale, lam, eps, n_tokens) refuse NaN and inf, and
``newton_schulz_pinv`` raises on a matrix it cannot invert instead of returning NaN.
"""
import math
from dataclasses import dataclass
from typing import Callable, Dict

import pytest
import torch

from mmeffattn import ops
from mmeffattn.ops import _backend

pytestmark = pytest.mark.usefixtures('one_thread')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
TRITON_RUNNABLE = _backend.HAS_TRITON and (DEVICE == 'cuda' or _backend.TRITON_INTERPRET)
BACKENDS = ['reference', 'torch', pytest.param('triton', marks=pytest.mark.skipif(
    not TRITON_RUNNABLE, reason='needs Triton with a CUDA GPU or its CPU interpreter'))]
VALUES = {'nan': math.nan, 'inf': math.inf}


@dataclass
class Case:
    """``fn(backend, **inputs)`` runs the op; ``make()`` gives fresh fp32 inputs (seeded)."""
    fn: Callable[..., torch.Tensor]
    make: Callable[[], Dict[str, torch.Tensor]]


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE)


def _spd(n_mat: int, m: int) -> torch.Tensor:
    """``[1, n_mat, m, m]`` Laplacian-kernel matrices (symmetric, positive entries, PD)."""
    z = torch.randn(1, n_mat, m, 4, device=DEVICE) * 2
    return torch.exp(-torch.cdist(z, z, p=1))


CASES = {
    # one window of 2 x 2 keys per query (hw 3 x 5, window 2): few keys, where CPU SDPA lost NaN
    'sema_attention': Case(
        lambda backend, q, k, v: ops.sema_attention(q, k, v, (3, 5), 2, backend=backend),
        lambda: dict(q=_randn(1, 2, 15, 16), k=_randn(1, 2, 15, 16), v=_randn(1, 2, 15, 16))),
    # 4 x 4 windows (16 keys, partial ones at the edges): the torch backend takes torch's fused
    # attention there in fp32 (FUSED_MIN_KEYS)
    'sema_attention-fused': Case(
        lambda backend, q, k, v: ops.sema_attention(q, k, v, (6, 9), 4, backend=backend),
        lambda: dict(q=_randn(1, 2, 54, 16), k=_randn(1, 2, 54, 16), v=_randn(1, 2, 54, 16))),
    # the mean returned apart (return_mean=True, as the backbone calls it): both outputs, flat
    'sema_attention-return_mean': Case(
        lambda backend, q, k, v: torch.cat([t.flatten() for t in ops.sema_attention(
            q, k, v, (3, 5), 2, return_mean=True, backend=backend)]),
        lambda: dict(q=_randn(1, 2, 15, 16), k=_randn(1, 2, 15, 16), v=_randn(1, 2, 15, 16))),
    # q and k packed [B, N, 2, heads, D]; the poisoned element (a third of the way in) is a key
    # (token 6, keys half, head 0), which reaches every query of its 2 x 2 window
    'sema_attention_qk': Case(
        lambda backend, qk, v: ops.sema_attention_qk(qk, v, (4, 5), 2, backend=backend),
        lambda: dict(qk=_randn(1, 20, 2, 2, 16), v=_randn(1, 2, 20, 16))),
    # C = 16 cores: the torch backend's patch-to-core attention is fused too
    'core_periphery_attention-fused': Case(
        lambda backend, q, k, v: ops.core_periphery_attention(q, k, v, 16, backend=backend),
        lambda: dict(q=_randn(1, 2, 29, 16), k=_randn(1, 2, 29, 16), v=_randn(1, 2, 29, 16))),
    # the case: a patch query attends over C = 2 core keys only
    'core_periphery_attention': Case(
        lambda backend, q, k, v: ops.core_periphery_attention(q, k, v, 2, backend=backend),
        lambda: dict(q=_randn(1, 2, 7, 16), k=_randn(1, 2, 7, 16), v=_randn(1, 2, 7, 16))),
    'core_periphery_attention-rope': Case(
        lambda backend, q, k, v, cos, sin: ops.core_periphery_attention(
            q, k, v, 2, rope=(cos, sin), backend=backend),
        lambda: dict(q=_randn(1, 2, 7, 16), k=_randn(1, 2, 7, 16), v=_randn(1, 2, 7, 16),
                     cos=_randn(1, 7, 16), sin=_randn(1, 7, 16))),
    'dynamic_weight': Case(
        lambda backend, u, v, weight: ops.dynamic_weight(u, v, 10, weight=weight,
                                                         backend=backend),
        lambda: dict(u=_randn(2, 3, 5), v=_randn(2, 3, 4), weight=_randn(4, 5))),
    # a tap of the static weight / kernel also lands on the zero padding at the border
    'dynamic_dwconv': Case(
        lambda backend, x, kernel, bias, weight: ops.dynamic_dwconv(
            x, kernel, bias, weight, backend=backend),
        lambda: dict(x=_randn(2, 3, 5, 6), kernel=_randn(2, 3, 3, 3), bias=_randn(3),
                     weight=_randn(3, 1, 3, 3))),
    'dynamic_dwconv-normalize': Case(
        lambda backend, x, kernel, weight: ops.dynamic_dwconv(
            x, kernel, None, weight, normalize=True, backend=backend),
        lambda: dict(x=_randn(1, 2, 4, 5), kernel=_randn(1, 2, 3, 3), weight=_randn(2, 3, 3))),
    # K // 2 = 3 >= the map's 2 rows: some taps reach no pixel at all
    'dynamic_dwconv-kernel-wider-than-map': Case(
        lambda backend, x, kernel: ops.dynamic_dwconv(x, kernel, backend=backend),
        lambda: dict(x=_randn(1, 2, 2, 3), kernel=_randn(1, 2, 7, 7))),
    'laplacian_kernel': Case(
        lambda backend, x, y: ops.laplacian_kernel(x, y, 2.0, backend=backend),
        lambda: dict(x=_randn(1, 2, 5, 16), y=_randn(1, 2, 4, 16))),
    # two matrices: a non-finite entry poisons its own matrix only
    'newton_schulz_pinv': Case(
        lambda backend, a: ops.newton_schulz_pinv(a, 12, 0.01, backend=backend),
        lambda: dict(a=_spd(2, 5))),
}


def _inputs(case: str) -> Dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return CASES[case].make()


PARAMS = [(case, name) for case in CASES for name in _inputs(case)]


def _poisoned(inputs: Dict[str, torch.Tensor], name: str, value: float) -> Dict[str, torch.Tensor]:
    x = inputs[name].clone()
    x.view(-1)[x.numel() // 3] = value  # a middle element (for the cores op: a patch token)
    return dict(inputs, **{name: x})


def _dependents(case: str, inputs: Dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The outputs of the float64 reference that change when the element changes."""
    ref = {n: t.double() for n, t in inputs.items()}
    changed = dict(ref, **{name: ref[name].clone()})
    changed[name].view(-1)[ref[name].numel() // 3] += 1.0
    fn = CASES[case].fn
    return fn('reference', **changed) != fn('reference', **ref)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('value', list(VALUES))
@pytest.mark.parametrize('case,name', PARAMS, ids=[f'{c}-{n}' for c, n in PARAMS])
def test_non_finite_input_reaches_its_dependents_only(case, name, value, backend) -> None:
    fn, inputs = CASES[case].fn, _inputs(case)
    dep = _dependents(case, inputs, name)
    assert dep.any() and not dep.all(), 'the case must have outputs on both sides'
    clean = fn(backend, **inputs)
    out = fn(backend, **_poisoned(inputs, name, VALUES[value]))
    # outputs that do not depend on the element are untouched
    torch.testing.assert_close(out[~dep], clean[~dep], rtol=1e-5, atol=1e-6)
    if value == 'nan':
        assert torch.equal(out.isnan(), dep), \
            f'{case}: NaN in {name} reached {int(out.isnan().sum())} outputs, ' \
            f'{int(dep.sum())} depend on it'
    else:
        assert not (~torch.isfinite(out) & ~dep).any()
        # IEEE arithmetic of the formula, the same on every backend
        ref = fn('reference', **_poisoned(inputs, name, VALUES[value]))
        assert torch.equal(torch.isfinite(out), torch.isfinite(ref))
        fin = torch.isfinite(ref)
        torch.testing.assert_close(out[fin], ref[fin], rtol=1e-4, atol=1e-5)


SCALARS = [
    ('sema_attention-scale', lambda x, s: ops.sema_attention(
        x.q, x.k, x.v, (3, 5), 2, scale=s), 'sema_attention', 'scale'),
    ('core_periphery_attention-scale', lambda x, s: ops.core_periphery_attention(
        x.q, x.k, x.v, 2, scale=s), 'core_periphery_attention', 'scale'),
    ('dynamic_weight-scale', lambda x, s: ops.dynamic_weight(x.u, x.v, 10, scale=s),
     'dynamic_weight', 'scale'),
    ('dynamic_weight-n_tokens', lambda x, s: ops.dynamic_weight(x.u, x.v, s),
     'dynamic_weight', 'n_tokens'),
    ('laplacian_kernel-lam', lambda x, s: ops.laplacian_kernel(x.x, x.y, s),
     'laplacian_kernel', 'lam'),
    ('newton_schulz_pinv-eps', lambda x, s: ops.newton_schulz_pinv(x.a, 4, s),
     'newton_schulz_pinv', 'eps'),
]


class _Attrs(dict):
    __getattr__ = dict.__getitem__


@pytest.mark.parametrize('value', [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize('call,case,arg', [s[1:] for s in SCALARS], ids=[s[0] for s in SCALARS])
def test_non_finite_float_argument_is_refused(call, case, arg, value) -> None:
    with pytest.raises(ValueError, match=fr'{case}: {arg} must be a (positive )?finite float'):
        call(_Attrs(_inputs(case.split('-')[0])), value)


@pytest.mark.parametrize('backend', BACKENDS)
def test_newton_schulz_raises_on_a_matrix_it_cannot_invert(backend) -> None:
    a = _spd(2, 4)
    a[0, 1] = 0.  # the second matrix is zero: not invertible (eps = 0)
    with pytest.raises(ValueError, match=r'(?s)1 of the 2 matrices did not converge.*\[0, 1\]'
                                         r'.*singular.*eps > 0.*check=False'):
        ops.newton_schulz_pinv(a, 20, 0., backend=backend)
    # check=False hands back the iterate; the invertible matrix is still inverted
    out = ops.newton_schulz_pinv(a, 20, 0., check=False, backend=backend)
    assert out[0, 1].isnan().all()
    torch.testing.assert_close(out[0, 0] @ a[0, 0], torch.eye(4, device=DEVICE), atol=1e-4,
                               rtol=0)


@pytest.mark.parametrize('backend', BACKENDS)
def test_newton_schulz_raises_when_it_diverges(backend) -> None:
    # symmetric positive definite (eigenvalues 0.1 and 3.9), but the negative off-diagonal makes
    # the largest row sum (0.1) far below the largest eigenvalue: alpha = 1.8 / 0.1^2 overshoots
    # and the iteration diverges
    a = torch.tensor([[[[2., -1.9], [-1.9, 2.]]]], device=DEVICE)
    assert not ops.newton_schulz_residual(
        a, ops.newton_schulz_pinv(a, 10, 0., check=False, backend=backend), 0.).item() < 1
    with pytest.raises(ValueError, match=r'1 of the 1 matrices did not converge'):
        ops.newton_schulz_pinv(a, 10, 0., backend=backend)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('magnitude', [1e-20, 1e-10, 1e10, 1e20])
def test_newton_schulz_scales_its_first_iterate(backend, magnitude) -> None:
    """``alpha = 1.8 / s^2`` overflowed for s = 1e20 (zeros came out) and 1 / s^2 for 1e-20
    (NaN); the initial iterate is now scaled so both converge. The reference is the plain
    formula, whose ``s^2`` is in range only in float64."""
    eye = torch.eye(4, device=DEVICE)
    a = (magnitude * (eye + 0.1 * _spd(1, 4)[0, 0]))[None, None]
    a = a.double() if backend == 'reference' else a
    out = ops.newton_schulz_pinv(a, 20, 0., backend=backend)
    expected = torch.linalg.inv(a.double())
    torch.testing.assert_close(out.double() / expected.abs().amax(), expected
                               / expected.abs().amax(), rtol=0, atol=1e-5)
