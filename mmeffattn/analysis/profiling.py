"""Where a model's time goes: one profiled forward (or training step) by op class and by module.

torch.profiler records the aten ops; each op's *self* CPU time goes to its class
(:data:`OP_CLASSES`) and to the innermost module running it (a ``record_function`` range opened by
forward hooks), so the module times are exclusive: a block's own time is the glue in its
``forward`` (reshapes, adds, casts), not its children's. A copy made inside a compute op (addmm's
bias broadcast into its output) counts as that op's class: copy/layout is what the model asks
for (reshape, contiguous, casts, pads). The op table lists the raw aten ops.
Under ``torch.compile`` the fused kernels have no aten op: their time is ``'compiled'`` and
modules are not attributed.
"""
import re
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

__all__ = ['OP_CLASSES', 'op_class', 'profile_model', 'format_profile']

#: the classes, in report order
OP_CLASSES = ('matmul', 'conv', 'attention', 'copy/layout', 'elementwise', 'norm', 'compiled',
              'other')

_CLASS_OF = {
    'matmul': r'addmm|mm|bmm|baddbmm|addbmm|matmul|linear|_mkl_linear|mkldnn_linear|addmv|mv'
              r'|einsum|dot',
    'conv': r'.*conv.*',
    'attention': r'.*(attention|_flash_|softmax).*',
    'copy/layout': r'copy_|_to_copy|clone|contiguous|cat|stack|constant_pad_nd|fill_|zero_'
                   r'|index_select|gather|index|roll|flip|im2col|col2im|to_dense|to_mkldnn'
                   r'|.*reorder.*|_cat',
    'norm': r'.*(layer_norm|batch_norm|group_norm).*',
    'elementwise': r'(add|sub|mul|div|neg|exp|exp2|pow|sqrt|rsqrt|reciprocal|where|masked_fill'
                   r'|gelu|silu|relu|elu|sigmoid|tanh|hardswish|clamp|clamp_min|clamp_max'
                   r'|leaky_relu|sum|mean|amax|max|min|abs|sin|cos|log|threshold|lerp'
                   r'|addcmul|addcdiv|fmod|remainder|eq|ne|lt|gt|le|ge|bitwise_not|logical_not'
                   r'|.*_backward|mish|softplus)_?',
}
_PATTERNS = [(c, re.compile(p)) for c, p in _CLASS_OF.items()]
_MODULE = 'module::'


def op_class(name: str) -> str:
    """The class of a profiler event ``name`` (``'aten::addmm'`` -> ``'matmul'``)."""
    if 'Compiled' in name or name.startswith(('cpp_fused', 'graph_')):
        return 'compiled'
    base = name.split('::', 1)[-1]
    # order matters: a convolution backward is a conv, ``gelu_backward`` elementwise
    for cls, pattern in _PATTERNS:
        if pattern.fullmatch(base):
            return cls
    return 'other'


def _inner_class(event) -> str:
    """The class of ``event``; a copy called by a compute op directly has that op's class."""
    cls, parent = op_class(event.name), event.cpu_parent
    if cls == 'copy/layout' and parent is not None and parent.name.startswith('aten::'):
        outer = op_class(parent.name)
        return outer if outer not in ('copy/layout', 'other') else cls
    return cls


def _module_ranges(model: nn.Module) -> List[Any]:
    """Forward hooks opening a ``module::<name>`` range around each submodule's forward."""
    stack: List[Any] = []

    def pre(name):
        def hook(module, args):
            rf = torch.autograd.profiler.record_function(_MODULE + name)
            rf.__enter__()
            stack.append(rf)
        return hook

    def post(module, args, output):
        stack.pop().__exit__(None, None, None)

    handles = []
    for name, module in model.named_modules():
        name = name or type(model).__name__
        handles += [module.register_forward_pre_hook(pre(f'{name} ({type(module).__name__})')),
                    module.register_forward_hook(post)]
    return handles


def profile_model(model: nn.Module, x: torch.Tensor, dtype: torch.dtype = torch.float32,
                  backward: bool = False, compiled: Optional[nn.Module] = None,
                  warmup: int = 1, top: int = 15) -> Dict[str, Any]:
    """Profile one call of ``model(x)`` (after ``warmup`` calls): forward under ``no_grad``, or
    with ``backward`` forward plus the backward of the outputs' sum; 16-bit ``dtype`` runs
    under autocast; ``compiled`` (``torch.compile(model)``) is called instead of ``model``.

    Returns:
        A JSON-ready dict: ``total_ms`` (wall clock of the profiled call), ``classes`` (class ->
        ``{'ms', 'share'}``), ``ops`` (the ``top`` aten ops by self time, with calls and class),
        ``modules`` (the ``top`` modules by exclusive time; eager only) and ``module_types``
        (exclusive time summed per module class).
    """
    from mmeffattn.analysis.benchmarking import backward_of_outputs
    fn = compiled if compiled is not None else model
    autocast = torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32)

    def call() -> None:
        with torch.set_grad_enabled(backward), autocast:
            outs = fn(x)
        if backward:
            backward_of_outputs(outs)
            for p in model.parameters():
                p.grad = None

    for _ in range(warmup):
        call()
    handles = _module_ranges(model) if compiled is None else []
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            call()
            total_ms = (time.perf_counter() - t0) * 1e3
    finally:
        for h in handles:
            h.remove()
    return _summarize(prof.events(), total_ms, top)


def _summarize(events, total_ms: float, top: int) -> Dict[str, Any]:
    classes: Dict[str, float] = dict.fromkeys(OP_CLASSES, 0.)
    ops: Dict[str, List[float]] = defaultdict(lambda: [0, 0.])  # name -> [calls, self us]
    modules: Dict[str, float] = defaultdict(float)
    for e in events:
        us = e.self_cpu_time_total
        if e.name.startswith(_MODULE):  # the module's Python between its ops
            cls, owner = 'other', e
        else:
            cls, owner = _inner_class(e), e.cpu_parent
            ops[e.name][0] += 1
            ops[e.name][1] += us
        while owner is not None and not owner.name.startswith(_MODULE):
            owner = owner.cpu_parent
        modules[owner.name[len(_MODULE):] if owner is not None else '(outside modules)'] += us
        classes[cls] += us
    profiled = sum(classes.values()) or 1.

    def entry(us: float, **kw) -> Dict[str, Any]:
        return dict(kw, ms=round(us / 1e3, 3), share=round(us / profiled, 4))

    types: Dict[str, float] = defaultdict(float)
    for name, us in modules.items():
        types[name.rsplit(' (', 1)[-1].rstrip(')')] += us
    by_time = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
    return dict(
        total_ms=round(total_ms, 2), profiled_ms=round(profiled / 1e3, 2),
        classes={c: entry(us) for c, us in classes.items()},
        ops=[entry(us, name=n, calls=int(calls), op_class=op_class(n))
             for n, (calls, us) in by_time],
        modules=[entry(us, name=n) for n, us in sorted(modules.items(), key=lambda kv: -kv[1])
                 [:top] if len(modules) > 1],
        module_types=[entry(us, name=n) for n, us in sorted(types.items(), key=lambda kv: -kv[1])
                      if len(modules) > 1])


def format_profile(result: Dict[str, Any]) -> str:
    """A plain-text report of :func:`profile_model`'s result."""
    lines = [f'total {result["total_ms"]:.1f} ms (profiled {result["profiled_ms"]:.1f} ms of self '
             f'CPU time)', '', f'{"op class":<14}{"ms":>10}{"share":>8}']
    lines += [f'{c:<14}{v["ms"]:>10.1f}{v["share"]:>8.1%}'
              for c, v in result['classes'].items() if v['ms']]
    for title, key, width in (('aten op (class, calls)', 'ops', 56),
                              ('module (exclusive time)', 'modules', 56),
                              ('module class (exclusive time)', 'module_types', 56)):
        if not result[key]:
            continue
        lines += ['', f'{title:<{width}}{"ms":>10}{"share":>8}']
        for r in result[key]:
            label = r['name'] + (f' ({r["op_class"]}, {r["calls"]})' if key == 'ops' else '')
            lines.append(f'{label[:width - 1]:<{width}}{r["ms"]:>10.1f}{r["share"]:>8.1%}')
    return '\n'.join(lines)
