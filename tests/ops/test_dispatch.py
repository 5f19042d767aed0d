"""Every public op's dispatch (``mmeffattn/ops/_backend.py``): which of its three backends runs
('triton', 'torch', 'reference') for each request and input, the reasons against Triton, the
dispatch hook, the ops without Triton, and the torch backend against the reference (odd shapes,
forward and backward). The op-specific Triton checks are in each op's own test file."""
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import mmeffattn.ops as ops
from mmeffattn.ops import _backend
from mmeffattn.ops._spec import SPECS
from mmeffattn.ops.sema.naive import unbind_qk
from dispatch_spy import spy_on
from op_checks import (DEVICE, DTYPES, HAS_CUDA, TRITON_RUNNABLE, assert_close,
                       check_import_without_triton, needs_triton, triton_request_fails)

pytestmark = pytest.mark.usefixtures('one_thread')

Call = Tuple[tuple, Dict[str, Any]]


def _leaves(x) -> List[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _sema(**kw) -> Callable[[], Call]:
    # a 5 x 6 grid in windows of 4 (16 keys: torch's fused attention; both sides padded)
    return lambda: ((*(_randn(1, 2, 30, 16, seed=i) for i in range(3)), (5, 6), 4), kw)


def _sema_qk(**kw) -> Callable[[], Call]:
    return lambda: ((_randn(1, 30, 2, 2, 16), _randn(1, 2, 30, 16, seed=1), (5, 6), 4), kw)


def _core_periphery(rope: bool = True, B: int = 1, C: int = 3, N: int = 20,
                    D: int = 16) -> Callable[[], Call]:
    # 3 cores + 20 patches: the core rows see 23 keys (fused attention), the patches 3
    def make():
        q, k, v = (_randn(B, 2, C + N, D, seed=i) for i in range(3))
        tables = (_randn(B, C + N, D, seed=3).cos(), _randn(B, C + N, D, seed=3).sin())
        return (q, k, v, C), dict(rope=tables if rope else None)
    return make


def _kernel_matrix(backward: str = 'unrolled') -> Callable[[], Call]:
    def make():
        pts = _randn(1, 2, 7, 16)
        return (torch.exp(-torch.cdist(pts, pts, p=1) / 32.), 12, 0.01), dict(backward=backward)
    return make


@dataclass
class Op:
    """One public op: its name (an attribute of :mod:`mmeffattn.ops`), its folder, its inputs
    (odd sizes; the first call is the dispatch tests' one) and its Triton-reasons function."""
    name: str
    folder: str
    reasons: str
    calls: List[Callable[[], Call]]
    #: the reasons function's arguments, from the call's
    reason_args: Callable[[tuple, dict], tuple] = lambda args, kwargs: args[:3]
    #: tl.dot in the kernels: bf16 cannot run under the interpreter
    uses_dot: bool = True
    ids: List[str] = field(default_factory=lambda: ['default'])

    @property
    def module(self):
        return importlib.import_module(f'mmeffattn.ops.{self.folder}.op')

    @property
    def fn(self) -> Callable:
        return getattr(ops, self.name)

    def call(self, dtype=torch.float32, device='cpu', i: int = 0, **extra) -> Any:
        args, kwargs = self.cast(self.calls[i](), dtype, device)
        return self.fn(*args, **kwargs, **extra)

    @staticmethod
    def cast(call: Call, dtype, device) -> Call:
        return tree_map(lambda x: x.to(device, dtype) if isinstance(x, torch.Tensor) else x, call)


OPS = [
    Op('sema_attention', 'sema', 'sema_triton_reasons',
       [_sema(), _sema(out_layout='bnhd'), _sema(return_mean=True), _sema(with_mean=False)],
       ids=['bhnd', 'bnhd', 'return_mean', 'no_mean']),
    Op('sema_attention_qk', 'sema', 'sema_triton_reasons',
       [_sema_qk(), _sema_qk(out_layout='bnhd', return_mean=True)],
       reason_args=lambda args, kwargs: (*unbind_qk(args[0]), args[1]),
       ids=['bhnd', 'bnhd-return_mean']),
    Op('core_periphery_attention', 'core_periphery', 'core_periphery_triton_reasons',
       [_core_periphery(), _core_periphery(rope=False), _core_periphery(B=2, C=5, N=19, D=24)],
       ids=['rope', 'no_rope', 'B2-C5-N19-D24-batch_rope']),
    Op('laplacian_kernel', 'laplacian', 'laplacian_triton_reasons',
       [lambda: ((_randn(1, 2, 7, 5), _randn(1, 2, 3, 5, seed=1), 2.0), {})],
       reason_args=lambda args, kwargs: args[:2], uses_dot=False),
    Op('dynamic_weight', 'dynamic_weight', 'dynamic_weight_triton_reasons',
       [lambda: ((_randn(2, 5, 6), _randn(2, 5, 4, seed=1), 21), dict(weight=_randn(4, 6)))],
       reason_args=lambda args, kwargs: (*args[:2], kwargs['weight'])),
    Op('dynamic_dwconv', 'dynamic_dwconv', 'dynamic_dwconv_triton_reasons',
       [lambda: ((_randn(1, 8, 5, 6), _randn(1, 8, 3, 3, seed=1), _randn(8, seed=2),
                  _randn(8, 1, 3, 3, seed=3)), dict(normalize=True)),
        # two samples as a token tensor's channels-last view (the torch backend's grouped form)
        lambda: ((_randn(2, 30, 8).transpose(1, 2).reshape(2, 8, 5, 6), _randn(2, 8, 3, 3, seed=1),
                  _randn(8, seed=2), _randn(8, 1, 3, 3, seed=3)), dict(normalize=True))],
       reason_args=lambda args, kwargs: args[:4], uses_dot=False, ids=['B1', 'B2-tokens']),
    Op('newton_schulz_pinv', 'newton_schulz', 'newton_schulz_triton_reasons',
       [_kernel_matrix(), _kernel_matrix('implicit')], reason_args=lambda args, kwargs: args[:1],
       uses_dot=False, ids=['unrolled', 'implicit']),
]
BY_NAME = {op.name: op for op in OPS}
ALL = [pytest.param(op, id=op.name) for op in OPS]
EVERY_CALL = [pytest.param(op, i, id=f'{op.name}-{op.ids[i]}')
              for op in OPS for i in range(len(op.calls))]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(_backend.ENV_VAR, raising=False)


# ------------------------------------------------------------------------------------------
# which backend runs
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('backend', ['torch', 'reference', 'triton'])
@pytest.mark.parametrize('op', ALL)
def test_backend_argument(op: Op, backend: str, monkeypatch, clean_env) -> None:
    if backend == 'triton' and not TRITON_RUNNABLE:
        pytest.skip('needs Triton with a CUDA GPU or its CPU interpreter')
    spies = spy_on(monkeypatch, op.module, op.name)
    op.call(device=DEVICE if backend == 'triton' else 'cpu', backend=backend)
    assert spies == [backend]


@pytest.mark.parametrize('op', ALL)
def test_env_var(op: Op, monkeypatch) -> None:
    """``$MMEFFATTN_OPS_BACKEND`` picks the backend of automatic calls; an explicit argument
    wins over it; an unknown value is an error naming the variable."""
    spies = spy_on(monkeypatch, op.module, op.name)
    for value in ('reference', 'torch'):
        monkeypatch.setenv(_backend.ENV_VAR, value)
        op.call()
    op.call(backend='reference')
    assert spies == ['reference', 'torch', 'reference']
    monkeypatch.setenv(_backend.ENV_VAR, 'cuda')
    with pytest.raises(ValueError, match=r"MMEFFATTN_OPS_BACKEND='cuda' is not a backend"):
        op.call()


@pytest.mark.parametrize('op', ALL)
def test_use_backend(op: Op, monkeypatch) -> None:
    """``ops.use_backend`` picks the backend of the calls that name none inside the block,
    over ``$MMEFFATTN_OPS_BACKEND``; the innermost block wins, an explicit argument wins over
    it, and the choice ends with the block (also on an error); an unknown name is an error."""
    monkeypatch.setenv(_backend.ENV_VAR, 'reference')
    spies = spy_on(monkeypatch, op.module, op.name)
    with ops.use_backend('torch'):
        op.call()
        with ops.use_backend('reference'):
            op.call()
        op.call(backend='reference')
        op.call()
    op.call()
    assert spies == ['torch', 'reference', 'reference', 'torch', 'reference']
    with pytest.raises(KeyError), ops.use_backend('torch'):
        raise KeyError
    assert not _backend._chosen
    with pytest.raises(ValueError, match=r"use_backend='cuda' is not a backend"):
        with ops.use_backend('cuda'):
            pass


@needs_triton
@pytest.mark.parametrize('op', ALL)
def test_auto_picks_triton_when_possible(op: Op, monkeypatch, clean_env) -> None:
    spies = spy_on(monkeypatch, op.module, op.name)
    op.call(device=DEVICE)
    assert spies == ['triton']


@pytest.mark.parametrize('op', ALL)
def test_cpu_without_interpreter(op: Op, monkeypatch, clean_env) -> None:
    """CPU tensors with the interpreter off: automatic -> torch; backend='triton' -> an error
    that lists the reason and the way out."""
    monkeypatch.setattr(_backend, 'TRITON_INTERPRET', False)
    spies = spy_on(monkeypatch, op.module, op.name)
    args, kwargs = op.calls[0]()
    reasons = getattr(op.module, op.reasons)(*op.reason_args(args, kwargs))
    assert any('interpreter is off' in r for r in reasons), reasons
    op.call()
    assert spies == ['torch']
    with pytest.raises(RuntimeError, match=r"(?s)Triton backend was requested.*interpreter is "
                                           r"off.*backend='torch'"):
        op.call(backend='triton')
    assert spies == ['torch']


@pytest.mark.parametrize('op', ALL)
def test_unsupported_dtypes_fall_back(op: Op, monkeypatch, clean_env) -> None:
    """fp64 (gradcheck through the public op) runs the torch backend automatically, and so
    does bf16 under the interpreter for kernels with ``tl.dot``; forcing Triton names why."""
    spies = spy_on(monkeypatch, op.module, op.name)
    op.call(torch.float64)
    assert spies == ['torch']
    with pytest.raises(RuntimeError, match='float64'):
        op.call(torch.float64, backend='triton')
    if _backend.TRITON_INTERPRET and not HAS_CUDA:
        op.call(torch.bfloat16)
        assert spies[-1] == ('torch' if op.uses_dot else 'triton')


INT32_CASES = {  # meta inputs whose offsets overflow int32, and ones just inside
    'sema_attention': lambda big: [torch.empty_strided((1, 1, 2, 16), (0, 0, big, 1),
                                                       device='meta')] * 3,
    'core_periphery_attention': lambda big: [torch.empty_strided((1, 1, 2, 16), (0, 0, big, 1),
                                                                 device='meta')] * 3,
    'laplacian_kernel': lambda big: [torch.empty_strided((1, 1, 2, 16), (0, 0, big, 1),
                                                         device='meta'),
                                     torch.empty((1, 1, 3, 16), device='meta')],
    'dynamic_dwconv': lambda big: [torch.empty_strided((1, 2, 2, 2), (0, big // 2, big // 2, 1),
                                                       device='meta'),
                                   torch.empty(1, 2, 3, 3, device='meta')],
    'dynamic_weight': lambda big: [torch.empty_strided((1, 2, 16), (0, big, 1), device='meta'),
                                   torch.empty(1, 2, 16, device='meta')],
}


@pytest.mark.parametrize('name', sorted(INT32_CASES))
def test_int32_offset_reason(name: str) -> None:
    """Inputs whose offsets reach 2**31 are a reason against the kernels (int32 offsets)."""
    op = BY_NAME[name]
    reasons = getattr(op.module, op.reasons)
    assert any('2**31' in r for r in reasons(*INT32_CASES[name](2 ** 31), interpret=True))
    assert not any('2**31' in r for r in reasons(*INT32_CASES[name](2 ** 29), interpret=True))


# ------------------------------------------------------------------------------------------
# the rules themselves
# ------------------------------------------------------------------------------------------
def test_select_backend_rules(clean_env) -> None:
    ok, bad = (lambda: []), (lambda: ['reason one', 'reason two'])
    assert _backend.select_backend('op', None, ok) == 'triton'
    assert _backend.select_backend('op', None, bad) == 'torch'
    for backend in ('torch', 'reference', 'triton'):
        assert _backend.select_backend('op', backend, ok) == backend
    assert _backend.select_backend('op', 'torch', bad) == 'torch'
    with pytest.raises(RuntimeError, match=r'(?s)reason one.*reason two'):
        _backend.select_backend('op', 'triton', bad)
    with pytest.raises(ValueError, match='not a backend'):
        _backend.select_backend('op', 'cuda', ok)


def test_env_var_values(monkeypatch) -> None:
    ok = lambda: []  # noqa: E731
    monkeypatch.setenv(_backend.ENV_VAR, 'auto')
    assert _backend.select_backend('op', None, ok) == 'triton'
    monkeypatch.setenv(_backend.ENV_VAR, 'triton')
    with pytest.raises(RuntimeError, match='r1'):
        _backend.select_backend('op', None, lambda: ['r1'])
    monkeypatch.setenv(_backend.ENV_VAR, 'bogus')
    with pytest.raises(ValueError, match=r'MMEFFATTN_OPS_BACKEND=\'bogus\''):
        _backend.select_backend('op', None, ok)


def test_dtype_and_device_reasons() -> None:
    q = torch.zeros(1, 1, 4, 16)
    dtypes = _backend.KERNEL_DTYPES
    assert _backend.can_run_device([q], interpret=True) == []
    assert _backend.can_run_device([q], interpret=False)
    assert _backend.can_run_device([q.to('meta')], interpret=True)
    assert any('float64' in r for r in _backend.can_run_dtype([q.double()], dtypes))
    assert any('interpreter' in r
               for r in _backend.can_run_dtype([q.bfloat16()], dtypes, interpret=True))
    assert _backend.can_run_dtype([q.bfloat16()], dtypes, interpret=True, uses_dot=False) == []
    assert _backend.can_run_dtype([q.half()], dtypes, interpret=True) == []


# ------------------------------------------------------------------------------------------
# the dispatch hook
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('op', ALL)
def test_dispatch_hook_sees_every_call(op: Op, clean_env) -> None:
    """Inside ``dispatch_hook`` each call reports its op name and validated arguments, and the
    hook's return value is the call's result; the innermost hook alone sees it."""
    seen, outer = [], []

    def hook(name, run, args, kwargs):
        seen.append((name, args, kwargs))
        return run(*args, **kwargs)

    plain = op.call(backend='torch')
    with ops.dispatch_hook(lambda *a: outer.append(a)), ops.dispatch_hook(hook):
        hooked = op.call(backend='torch')
    assert not outer and len(seen) == 1 and seen[0][0] == op.name
    assert isinstance(seen[0][1][0], torch.Tensor)
    for a, b in zip(_leaves(plain), _leaves(hooked)):
        assert torch.equal(a, b)
    assert not _backend._hooks


# ------------------------------------------------------------------------------------------
# the torch backend against the reference
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('grad', [True, False], ids=['grad', 'no_grad'])
@pytest.mark.parametrize('dtype', ['fp32', 'fp16', 'bf16'])
@pytest.mark.parametrize('op, i', EVERY_CALL)
def test_torch_matches_reference(op: Op, i: int, dtype: str, grad: bool, clean_env) -> None:
    """The torch backend in ``dtype`` against the reference in float64, forward and (``grad``)
    every input's gradient for one upstream gradient; without a gradient the fused and masked
    paths of the attention ops differ from the training ones."""
    dt = DTYPES[dtype]
    args, kwargs = op.cast(op.calls[i](), dt, 'cpu')
    args64, kwargs64 = op.cast((args, kwargs), torch.float64, 'cpu')  # the same (rounded) values
    leaves, leaves64 = _leaves((args, kwargs)), _leaves((args64, kwargs64))
    for t in leaves + leaves64:
        t.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = _leaves(op.fn(*args, **kwargs, backend='torch'))
    ref = _leaves(op.fn(*args64, **kwargs64, backend='reference'))
    for j, (o, r) in enumerate(zip(out, ref)):
        assert o.dtype == dt and o.shape == r.shape
        assert_close(o, r, dt, f'out{j}')
    if grad:
        gs = [_randn(*o.shape, seed=9 + j) for j, o in enumerate(out)]
        torch.autograd.backward(out, [g.to(dt) for g in gs])
        torch.autograd.backward(ref, [g.double() for g in gs])
        for j, (t, t64) in enumerate(zip(leaves, leaves64)):
            assert_close(t.grad, t64.grad, dt, f'grad of input {j}')


@needs_triton
@pytest.mark.parametrize('op, i', EVERY_CALL)
def test_triton_matches_torch(op: Op, i: int, clean_env) -> None:
    """The Triton kernels against the torch backend (each is checked against the reference in
    its op's tests), fp32, forward and every input's gradient for one upstream gradient."""
    args, kwargs = op.cast(op.calls[i](), torch.float32, DEVICE)
    outs, grads = [], []
    for backend in ('triton', 'torch'):
        a, kw = tree_map(lambda x: x.detach().clone().requires_grad_()
                         if isinstance(x, torch.Tensor) else x, (args, kwargs))
        out = _leaves(op.fn(*a, **kw, backend=backend))
        torch.autograd.backward(out, [_randn(*o.shape, seed=9 + j).to(DEVICE)
                                      for j, o in enumerate(out)])
        outs.append(out)
        grads.append([t.grad for t in _leaves((a, kw))])
    for j, (o, e) in enumerate(zip(*outs)):
        assert_close(o, e, torch.float32, f'out{j}')
    for j, (g, e) in enumerate(zip(*grads)):
        assert_close(g, e, torch.float32, f'grad of input {j}')


@pytest.mark.parametrize('spec', SPECS, ids=lambda s: s.name)
def test_spec_example(spec, clean_env) -> None:
    """Each op's example at its default sizes (the call the GPU check and the benchmarks make)
    calls the op once, with the MACs the op's counter gives that call, and its torch backend
    agrees with the reference in fp64 on the same values."""
    from mmeffattn.analysis.flops import op_macs
    torch.manual_seed(0)
    ex = spec.example()
    macs = []

    def hook(name, run, args, kwargs):
        macs.append(op_macs(name, *args, **kwargs))
        return run(*args, **kwargs)

    with ops.dispatch_hook(hook):
        out = ex.fn('torch', *ex.inputs)
    assert macs == [ex.macs]
    assert_close(out, ex.fn('reference', *(x.double() for x in ex.inputs)), torch.float32, 'out')


# ------------------------------------------------------------------------------------------
# without Triton; the public names
# ------------------------------------------------------------------------------------------
def test_import_without_triton() -> None:
    """``import mmeffattn.ops`` works without Triton; every op runs its torch backend
    automatically and an explicit Triton request says why it cannot."""
    calls = ['sema_attention(q, q, q, (5, 6), 4)', 'sema_attention_qk(qk, q, (5, 6), 4)',
             'core_periphery_attention(q, q, q, 3)', 'laplacian_kernel(q, q[:, :, :7], 2.0)',
             'dynamic_weight(u, u[..., :4], 21)', 'dynamic_dwconv(x, x[:, :, :3, :3])',
             'newton_schulz_pinv(a, 12, 0.01)']
    check_import_without_triton([
        'import torch, mmeffattn.ops as ops', 'from mmeffattn.ops import _backend',
        'assert not _backend.HAS_TRITON',
        'q, qk, u, x = (torch.randn(s) for s in [(1, 2, 30, 16), (1, 30, 2, 2, 16), (2, 5, 6), '
        '(1, 8, 5, 6)])',
        'a = torch.exp(-torch.cdist(q, q, p=1) / 32)',
        *(line for call in calls for line in [
            f'assert torch.equal(ops.{call}, ops.{call[:-1]}, backend="torch"))',
            *triton_request_fails(f'ops.{call[:-1]}, backend="triton")')])])


@pytest.mark.parametrize('op', ALL)
def test_public_api(op: Op) -> None:
    assert op.fn is getattr(op.module, op.name)
    assert getattr(ops, op.name + '_naive') is getattr(op.module, op.name + '_naive')
    assert {op.name, op.name + '_naive'} <= set(ops.__all__)
    package = importlib.import_module(f'mmeffattn.ops.{op.folder}')
    assert getattr(package, op.name) is op.fn
