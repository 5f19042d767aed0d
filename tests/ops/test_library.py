"""The ops as ``torch.library`` custom operators (``mmeffattn/ops/_library.py``): schema, fake
implementation and autograd registration (``torch.library.opcheck``), one node per op in
``torch.export``, and ``torch.compile(fullgraph=True)`` without graph breaks, on the Triton
backend (compiled on a GPU, interpreted on the CPU); outputs that are new tensors (not views
of the launchers' buffers), launch recording per thread, and every public op on fake and meta
tensors."""
import importlib
import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from torch.utils._python_dispatch import TorchDispatchMode

from mmeffattn import ops
from mmeffattn.ops import _backend, _launch
from mmeffattn.ops._common import is_eager
from mmeffattn.ops._library import NAMESPACE

from op_checks import DEVICE, needs_triton

pytestmark = [pytest.mark.usefixtures('one_thread'), needs_triton]


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(DEVICE)


def _spd(b, h, m):
    """Well-conditioned symmetric matrices (the iteration converges in a few steps)."""
    a = _rand(b, h, m, m) * 0.1
    return (a + a.transpose(-1, -2)) / 2 + torch.eye(m, device=DEVICE)


def _cases():
    """``name -> (library module, op name, tensors, call(*tensors) through the public op,
    op args(*tensors))``; tiny shapes with odd sizes."""
    cos, sin = _rand(1, 7, 16).cos(), _rand(1, 7, 16, seed=1).sin()
    return {
        'sema_attention': (
            'sema', [_rand(1, 2, 15, 16), _rand(1, 2, 15, 16, seed=1), _rand(1, 2, 15, 16, seed=2)],
            lambda q, k, v: ops.sema_attention(q, k, v, (3, 5), 2, backend='triton'),
            lambda q, k, v: (q, k, v, [3, 5], 2, 0.25, True, 'ieee')),
        'sema_attention_qk': (  # q and k packed [B, N, 2, heads, D], tokens-major output
            'sema', [_rand(1, 15, 2, 2, 16), _rand(1, 2, 15, 16, seed=2)],
            lambda qk, v: ops.sema_attention_qk(qk, v, (3, 5), 2, out_layout='bnhd',
                                                backend='triton'),
            lambda qk, v: (qk, v, [3, 5], 2, 0.25, True, 'ieee', 'bnhd')),
        'core_periphery_attention': (
            'core_periphery',
            [_rand(1, 2, 7, 16), _rand(1, 2, 7, 16, seed=1), _rand(1, 2, 7, 16, seed=2), cos, sin],
            lambda q, k, v, c, s: ops.core_periphery_attention(q, k, v, 2, rope=(c, s),
                                                               backend='triton'),
            lambda q, k, v, c, s: (q, k, v, c, s, 2, 0.25, 'ieee', None)),
        'laplacian_kernel': (
            'laplacian', [_rand(1, 2, 5, 6), _rand(1, 2, 7, 6, seed=1)],
            lambda x, y: ops.laplacian_kernel(x, y, 2.0, backend='triton'),
            lambda x, y: (x, y, 2.0)),
        'newton_schulz_pinv': (
            'newton_schulz', [_spd(1, 2, 5)],
            lambda a: ops.newton_schulz_pinv(a, 6, 0.01, check=False, backend='triton'),
            lambda a: (a, 6, 0.01, True, False)),
        'dynamic_weight': (
            'dynamic_weight', [_rand(2, 5, 6), _rand(2, 5, 7, seed=1), _rand(7, 6, seed=2)],
            lambda u, v, w: ops.dynamic_weight(u, v, 20.0, weight=w, backend='triton'),
            lambda u, v, w: (u, v, w, 0.05, 'ieee')),
        'dynamic_dwconv': (
            'dynamic_dwconv',
            [_rand(1, 3, 5, 6), _rand(1, 3, 3, 3, seed=1), _rand(3, seed=2),
             _rand(3, 1, 3, 3, seed=3)],
            lambda x, k, b, w: ops.dynamic_dwconv(x, k, b, w, normalize=True, backend='triton'),
            lambda x, k, b, w: (x, k, b, w, True)),
    }


NAMES = list(_cases())


def _op(name):
    return getattr(torch.ops.mmeffattn, name)


def _case(name):
    folder, tensors, call, args = _cases()[name]
    importlib.import_module(f'mmeffattn.ops.{folder}.library')  # registers the operators
    return tensors, call, args


@pytest.mark.parametrize('name', NAMES)
def test_opcheck(name):
    """Schema, fake implementation (against the real kernels), autograd registration and the
    compiled-autograd path of ``mmeffattn::<op>``, with and without gradients."""
    tensors, _, args = _case(name)
    torch.library.opcheck(_op(name), args(*tensors))
    grads = [t.detach().requires_grad_() for t in tensors]
    torch.library.opcheck(_op(name), args(*grads))


@pytest.mark.parametrize('name', NAMES)
def test_public_op_dispatches_to_the_operator(name):
    """The Triton backend of the public function is the registered operator (its backward is in
    the autograd graph), with the reference's output and gradients."""
    tensors, call, _ = _case(name)
    x = [t.detach().requires_grad_() for t in tensors]
    out = call(*x)
    assert f'{name}' in out.grad_fn.name().lower(), out.grad_fn.name()
    out.square().sum().backward()
    r = [t.detach().requires_grad_() for t in tensors]
    ref = _reference(call, r)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    ref.square().sum().backward()
    for a, b in zip(x, r):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def _reference(call, tensors, backend: str = 'reference'):
    """``call`` (which asks for ``backend='triton'``) run on a PyTorch backend."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_backend, 'select_backend', lambda *a, **k: backend)
        return call(*tensors)


class _Call(torch.nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, *tensors):
        return self.call(*tensors)


@pytest.mark.parametrize('name', NAMES)
def test_export_one_node(name):
    """``torch.export`` of a module calling the public op on the Triton backend holds exactly one
    ``mmeffattn.<op>`` node (the call), and the exported program gives the eager output."""
    tensors, call, _ = _case(name)
    ep = torch.export.export(_Call(call), tuple(tensors))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == 'call_function']
    ours = [t for t in targets if t.startswith('mmeffattn.')]
    assert ours == [f'mmeffattn.{name}.default'], targets
    torch.testing.assert_close(ep.module()(*tensors), call(*tensors))


@pytest.mark.parametrize('name', NAMES)
def test_compile_fullgraph(name):
    """``torch.compile(fullgraph=True)`` of a function calling the registered operator (the
    library entry point the public op dispatches to) gives the eager output and gradients."""
    tensors, _, args = _case(name)
    op = _op(name)

    def fn(*t):
        out = op(*args(*t))
        return (out[0] if isinstance(out, (tuple, list)) else out).sin()

    x_eager = [t.detach().requires_grad_() for t in tensors]
    x_comp = [t.detach().requires_grad_() for t in tensors]
    eager = fn(*x_eager)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend='aot_eager', fullgraph=True)(*x_comp)
    torch.testing.assert_close(compiled, eager)
    eager.sum().backward()
    compiled.sum().backward()
    for a, b in zip(x_comp, x_eager):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize('backend', ['torch', 'reference'])
def test_pytorch_backends_are_plain_pytorch(backend):
    """The PyTorch backends do not go through the operators: export sees aten ops only (the
    path ONNX export takes)."""
    x, y = _rand(1, 2, 5, 6), _rand(1, 2, 7, 6, seed=1)
    ep = torch.export.export(
        _Call(lambda a, b: ops.laplacian_kernel(a, b, 2.0, backend=backend)), (x, y))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == 'call_function']
    assert targets and not any(t.startswith('mmeffattn.') for t in targets), targets


# ---------------------------------------------------------------------------------------------
# outputs: new tensors, not views of the launchers' buffers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', NAMES)
def test_output_is_a_new_contiguous_tensor(name):
    """The Triton backend returns a contiguous tensor of its own, as the reference does: not a
    view of a padded or work buffer (which it would keep alive, and which, as an operator's
    output, autograd does not let anyone modify in place): an in-place op on the output of a
    call that needs a gradient works. (A backward through the modified output is refused by
    the ops that save their output for it, as by ``torch.exp``.)"""
    tensors, call, _ = _case(name)
    x = [t.detach().requires_grad_() for t in tensors]
    out = call(*x)
    assert out._base is None and out.is_contiguous()
    out.mul_(2)
    torch.testing.assert_close(out, 2 * _reference(call, tensors), rtol=1e-4, atol=1e-5)


class _RecordCalls(TorchDispatchMode):
    """Records the ``mmeffattn`` operator calls (forward and backward) made under it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == NAMESPACE:
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


@pytest.mark.parametrize('name', NAMES)
def test_operator_outputs_are_new_tensors(name):
    """Every output of the forward and of the backward operator (the saved log-sum-exp, the
    iterates, the gradients) is a new contiguous tensor, not a view (of a padded buffer, of
    partial sums, of a reduction's result). Below autograd, where the calls are recorded, a
    view is not told apart, so each recorded call is repeated and its outputs checked."""
    tensors, call, _ = _case(name)
    x = [t.detach().requires_grad_() for t in tensors]
    with _RecordCalls() as record:
        call(*x).square().sum().backward()
    names = {func.overloadpacket.__name__ for func, _, _ in record.calls}
    assert names == {name, f'{name}_backward'}, names
    with torch.no_grad():
        for func, args, kwargs in record.calls:
            outs = func(*args, **kwargs)
            for i, t in enumerate(outs if isinstance(outs, (tuple, list)) else (outs, )):
                assert t._base is None and t.is_contiguous(), f'{func} output {i}'


# ---------------------------------------------------------------------------------------------
# launch recording (the fake implementations) is per thread
# ---------------------------------------------------------------------------------------------
def test_recording_launches_leaves_other_threads_launching():
    """While a thread records launches (as the fake implementations do: a fake-tensor trace),
    another thread's eager calls still launch their kernels. A recorder shared by the threads
    recorded them instead and left their outputs uninitialised."""
    x, y = _rand(1, 2, 5, 6), _rand(1, 2, 7, 6, seed=1)
    recording, done = threading.Event(), threading.Event()
    recorded = []

    def record():
        with _launch.record_launches() as launches:
            recording.set()
            done.wait(timeout=120)
        recorded.extend(launches)

    thread = threading.Thread(target=record)
    thread.start()
    try:
        assert recording.wait(timeout=120)
        out = ops.laplacian_kernel(x, y, 2.0, backend='triton')
    finally:
        done.set()
        thread.join()
    assert recorded == []
    torch.testing.assert_close(out, ops.laplacian_kernel_naive(x, y, 2.0))


def test_fake_trace_in_another_thread():
    """The reviewer's race: a thread calling the operator on fake tensors in a loop (each call
    runs the fake implementation, which records) while this thread calls the op eagerly."""
    x, y = _rand(1, 2, 5, 6), _rand(1, 2, 7, 6, seed=1)
    expected = ops.laplacian_kernel_naive(x, y, 2.0)
    importlib.import_module('mmeffattn.ops.laplacian.library')
    stop = threading.Event()
    fake_calls = []

    def trace():
        with FakeTensorMode() as mode:
            fx, fy = mode.from_tensor(x), mode.from_tensor(y)
            while not stop.is_set():
                fake_calls.append(torch.ops.mmeffattn.laplacian_kernel(fx, fy, 2.0).shape)

    thread = threading.Thread(target=trace)
    thread.start()
    try:
        outs = [ops.laplacian_kernel(x, y, 2.0, backend='triton') for _ in range(5)]
    finally:
        stop.set()
        thread.join()
    assert fake_calls
    for out in outs:
        torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------------------------------
# fake and meta tensors
# ---------------------------------------------------------------------------------------------
def test_is_eager():
    """Values can be read only eagerly, on real tensors: not under a FakeTensorMode, nor from
    a fake or a meta tensor."""
    x = torch.ones(2)
    assert is_eager() and is_eager(x, None)
    assert not is_eager(x.to('meta'))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert not is_eager() and not is_eager(x)
    assert not is_eager(fake) and not is_eager(x, fake)


@pytest.mark.parametrize('backend', ['triton', 'torch', 'reference'])
@pytest.mark.parametrize('name', NAMES)
def test_public_op_on_fake_tensors(name, backend):
    """Under a FakeTensorMode the public function gives the eager output's shape and dtype on
    every backend (Triton: the operator's fake implementation; the others: plain PyTorch, whose
    value checks are skipped, as a fake tensor has no values)."""
    tensors, call, _ = _case(name)
    expected = call(*tensors)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in tensors]
        out = call(*fakes) if backend == 'triton' else _reference(call, fakes, backend)
    assert is_fake(out)
    assert (out.shape, out.dtype) == (expected.shape, expected.dtype)


@pytest.mark.parametrize('name', NAMES)
def test_public_op_on_meta_tensors(name):
    """On meta tensors (which the kernels do not take) the automatic choice is the torch
    backend, which gives the eager output's shape and dtype without reading a value."""
    tensors, call, _ = _case(name)
    expected = call(*tensors)
    with pytest.MonkeyPatch.context() as mp:  # the call asks for Triton: let it choose
        mp.setattr(_backend, 'requested_backend', lambda backend: None)
        out = call(*[t.to('meta') for t in tensors])
    assert out.device.type == 'meta'
    assert (out.shape, out.dtype) == (expected.shape, expected.dtype)
