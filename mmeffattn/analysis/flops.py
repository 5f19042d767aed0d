"""FLOP counting (MACs, as the papers and mmengine) that understands mmeffattn's attention ops.

mmengine's ``FlopAnalyzer`` misses ``scaled_dot_product_attention`` (:func:`sdpa_flop_jit`) and
our ops. While :func:`count_flops` runs, a :func:`mmeffattn.ops.dispatch_hook` makes each op with
a counter (:data:`OP_COUNTERS`) one node named after it in the trace, which gets the analytic
count. Element-wise work is not counted.
"""
import functools
import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Tuple

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from mmeffattn.ops import dispatch_hook, use_backend
from mmeffattn.ops._spec import all_specs, sdpa_macs

__all__ = ['OP_COUNTERS', 'register_op_counter', 'op_macs', 'sdpa_macs', 'sdpa_flop_jit',
           'count_flops', 'FlopCount', 'CountedForward', 'count_parameters',
           'model_kind']

OpCounter = Callable[..., int]
#: public op name -> analytic MACs from its arguments (each op's ``spec.macs`` and entry points)
OP_COUNTERS: Dict[str, OpCounter] = {name: macs for spec in all_specs()
                                     for name, macs in ((spec.name, spec.macs),
                                                        *spec.entry_points.items())}


def register_op_counter(name: str) -> Callable[[OpCounter], OpCounter]:
    """Register ``fn(*args, **kwargs) -> MACs`` for the public op ``mmeffattn.ops.<name>``; it
    receives exactly the arguments the op is called with."""

    def wrap(fn: OpCounter) -> OpCounter:
        OP_COUNTERS[name] = fn
        return fn

    return wrap


def op_macs(name: str, *args: Any, **kwargs: Any) -> int:
    """Analytic MACs of one call of the public op ``name`` (``KeyError`` if it has no counter)."""
    if name not in OP_COUNTERS:
        raise KeyError(f'no FLOP counter for op {name!r}; registered: {sorted(OP_COUNTERS)} '
                       f'(add one with mmeffattn.analysis.flops.register_op_counter)')
    return int(OP_COUNTERS[name](*args, **kwargs))


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """mmengine handle of ``aten::scaled_dot_product_attention`` (q ``[..., L, D]``,
    k ``[..., S, D]``, v ``[..., S, Dv]``); mmengine's analyzer skips the op otherwise."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(x) for x in inputs[:3])
    return sdpa_macs(math.prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])


class _OpRecorder:
    """The analytic counts recorded while tracing, per op in call order; each op node's jit
    handle pops them in graph order (the same order)."""

    def __init__(self) -> None:
        self.queues: Dict[str, Deque[Tuple[Tuple[int, ...], int]]] = defaultdict(deque)
        self.calls: Counter = Counter()
        self.macs: Counter = Counter()

    def record(self, name: str, first_shape: Tuple[int, ...], macs: int) -> None:
        self.queues[name].append((first_shape, macs))
        self.calls[name] += 1
        self.macs[name] += macs

    def handle(self, name: str) -> Callable[[List[Any], List[Any]], int]:
        def jit_handle(inputs: List[Any], outputs: List[Any]) -> int:
            from mmengine.analysis.jit_handles import get_shape
            if not self.queues[name]:
                raise RuntimeError(f'FLOP count: the trace has more {name} nodes than calls '
                                   'were recorded')
            shape, macs = self.queues[name].popleft()
            got = tuple(get_shape(inputs[0]) or ())
            if got != shape:  # a mismatch would attribute one call's count to another
                raise RuntimeError(f'FLOP count: {name} node with input {got} met the record '
                                   f'of a call with input {shape}')
            return macs

        return jit_handle


@functools.lru_cache(maxsize=None)
def _counted_op_class(name: str) -> type:
    """An autograd Function named after the op, so the trace shows ``prim::PythonOp.<name>``."""

    def forward(ctx, run, *tensors):
        return run(*tensors)

    def backward(ctx, *grads):  # pragma: no cover - counting runs without gradients
        raise RuntimeError(f'{name}: the FLOP-counting wrapper is forward-only')

    return type(name, (torch.autograd.Function, ),
                dict(forward=staticmethod(forward), backward=staticmethod(backward)))


def _counting_hook(recorder: _OpRecorder) -> Callable:
    """The :func:`mmeffattn.ops.dispatch_hook` of :func:`count_flops`: each call of an op with a
    counter records its analytic MACs and runs as one node named after the op."""

    def hook(name: str, run: Callable, args: tuple, kwargs: Dict[str, Any]) -> Any:
        if name not in OP_COUNTERS:
            return run(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        # traced sizes arrive as 0-dim tensors: the counter and the op get plain numbers
        leaves = [leaf.item() if isinstance(leaf, torch.Tensor) and leaf.dim() == 0 and
                  not leaf.is_floating_point() else leaf for leaf in leaves]
        plain_args, plain_kwargs = tree_unflatten(leaves, spec)
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        recorder.record(name, tuple(leaves[where[0]].shape),
                        op_macs(name, *plain_args, **plain_kwargs))

        def run_tensors(*tensors: torch.Tensor) -> Any:
            filled = list(leaves)
            for i, t in zip(where, tensors):
                filled[i] = t
            call_args, call_kwargs = tree_unflatten(filled, spec)
            return run(*call_args, **call_kwargs)

        return _counted_op_class(name).apply(run_tensors, *(leaves[i] for i in where))

    return hook


@dataclass
class FlopCount:
    """Result of :func:`count_flops`. ``total`` and ``by_operator`` are MACs; ``ops`` holds
    the part of ``total`` spent in mmeffattn's ops; ``unsupported`` counts the traced ops that
    were not counted (element-wise ones, mostly)."""
    total: int
    by_operator: Dict[str, int]
    ops: Dict[str, int] = field(default_factory=dict)
    op_calls: Dict[str, int] = field(default_factory=dict)
    unsupported: Dict[str, int] = field(default_factory=dict)
    device: str = 'cpu'


def count_flops(model: nn.Module, inputs: Tuple[Any, ...]) -> FlopCount:
    """Count the MACs of ``model(*inputs)`` (one real forward, traced, without gradients).

    Args:
        model: any module; mmeffattn's ops inside it are counted analytically.
        inputs: the positional inputs of its forward (tensors).
    """
    device = next((str(x.device) for x in inputs if isinstance(x, torch.Tensor)), 'cpu')
    return _count(model, inputs, device)


def _count(model: nn.Module, inputs: Tuple[Any, ...], device: str) -> FlopCount:
    from mmengine.analysis import FlopAnalyzer
    recorder = _OpRecorder()
    with use_backend('torch'), dispatch_hook(_counting_hook(recorder)), torch.no_grad():
        analyzer = FlopAnalyzer(model, inputs)
        analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_jit)
        for name in OP_COUNTERS:
            analyzer.set_op_handle(f'prim::PythonOp.{name}', recorder.handle(name))
        analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        analyzer.tracer_warnings('none')
        total = analyzer.total()
        by_operator = dict(analyzer.by_operator())
        unsupported = dict(analyzer.unsupported_ops())
    left = {name: len(q) for name, q in recorder.queues.items() if q}
    if left:
        raise RuntimeError(f'FLOP count: recorded op calls never met in the trace: {left}')
    return FlopCount(total=int(total), by_operator=by_operator, ops=dict(recorder.macs),
                     op_calls=dict(recorder.calls), unsupported=unsupported, device=device)


def model_kind(model: nn.Module) -> str:
    """``'classifier'``, ``'detector'``, ``'segmentor'`` or ``'module'``, from the OpenMMLab base
    class names in the model's MRO (without importing the libraries)."""
    names = {cls.__name__ for cls in type(model).__mro__}
    for kind, base in (('classifier', 'ImageClassifier'), ('detector', 'BaseDetector'),
                       ('segmentor', 'BaseSegmentor')):
        if base in names:
            return kind
    return 'module'


class CountedForward(nn.Module):
    """What is counted for a built model: an mmpretrain classifier's logits (``mode='tensor'``),
    a detector's/segmentor's backbone, or a bare backbone."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.what = ('classifier' if model_kind(model) == 'classifier' else
                     'backbone' if hasattr(model, 'backbone') else 'module')

    @property
    def counted(self) -> nn.Module:
        """The module whose parameters and cost are reported."""
        return self.model.backbone if self.what == 'backbone' else self.model

    def forward(self, x: torch.Tensor) -> Any:
        if self.what == 'classifier':
            return self.model(x, mode='tensor')
        return self.counted(x)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
