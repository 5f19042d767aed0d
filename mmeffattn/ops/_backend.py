"""Backend selection shared by every op, and the dispatch hook (imports without Triton).

Backends: ``'triton'`` (the kernels; else ``RuntimeError`` listing every reason), ``'torch'``
(fast PyTorch) and ``'reference'`` (the formula). None takes the innermost :func:`use_backend`,
else ``$MMEFFATTN_OPS_BACKEND`` (a backend or ``auto``), else Triton when nothing stands against
it, otherwise ``'torch'`` (a CUDA fallback logs its reasons once). CPU tensors run Triton only
under its interpreter (``TRITON_INTERPRET=1`` before ``import triton``).
"""
import contextlib
import logging
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import torch

try:
    import triton
    HAS_TRITON = True
    _TRITON_IMPORT_ERROR = ''
except Exception as e:  # pragma: no cover - depends on the installation
    triton = None
    HAS_TRITON = False
    _TRITON_IMPORT_ERROR = f'{type(e).__name__}: {e}'


def _interpreter_on() -> bool:
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, 'knobs', None)
    if knobs is not None:  # triton >= 3.4
        return bool(knobs.runtime.interpret)
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')  # pragma: no cover


#: Whether Triton interprets kernels on the CPU in this process (fixed when triton is imported).
TRITON_INTERPRET: bool = _interpreter_on()

ENV_VAR = 'MMEFFATTN_OPS_BACKEND'
BACKENDS = ('triton', 'torch', 'reference')
#: the storage dtypes every op's Triton kernels take
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

logger = logging.getLogger('mmeffattn.ops')
_warned: set = set()


def can_run_device(tensors: Sequence[torch.Tensor], interpret: Optional[bool] = None) -> List[str]:
    """Reasons the tensors' device cannot run Triton kernels (``interpret``: default
    :data:`TRITON_INTERPRET`)."""
    interpret = TRITON_INTERPRET if interpret is None else interpret
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        return [f'inputs are on different devices ({sorted(map(str, devices))})']
    reasons = []
    for device in devices:
        if device.type == 'cuda':
            continue  # compiled, or interpreted with copies to the host when interpret is on
        if device.type == 'cpu':
            if not interpret:
                reasons.append('the inputs are CPU tensors and Triton\'s interpreter is off '
                               '(set TRITON_INTERPRET=1 before triton is imported to interpret '
                               'the kernels on the CPU, or move the inputs to a CUDA device)')
        else:
            reasons.append(f'device type {device.type!r} is not supported by the Triton kernels '
                           '(CUDA, or CPU with the interpreter)')
    return reasons


def can_run_dtype(tensors: Sequence[torch.Tensor], dtypes: Iterable[torch.dtype],
                  interpret: Optional[bool] = None, uses_dot: bool = True) -> List[str]:
    """Reasons the tensors' dtype cannot run the kernels; ``uses_dot``: the kernels use
    ``tl.dot``, which Triton's interpreter gets wrong for bf16."""
    interpret = TRITON_INTERPRET if interpret is None else interpret
    dtypes = tuple(dtypes)
    reasons = []
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        if dtype not in dtypes:
            reasons.append(f'dtype {dtype} is not supported by the Triton kernels '
                           f'(supported: {", ".join(map(str, dtypes))})')
        elif dtype == torch.bfloat16 and uses_dot:
            if interpret and any(t.device.type == 'cpu' for t in tensors):
                reasons.append('bfloat16 tl.dot gives wrong results in Triton\'s interpreter')
            elif any(t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 8
                     for t in tensors):
                reasons.append('bfloat16 kernels need a GPU of compute capability 8.0 or newer')
    return reasons


def triton_reasons(kernels: str, import_error: str, tensors: Sequence[torch.Tensor],
                   dtype_tensors: Sequence[torch.Tensor], dtypes: Iterable[torch.dtype],
                   interpret: Optional[bool] = None, uses_dot: bool = True) -> List[str]:
    """What every op checks before its kernels: Triton usable, the op's kernels imported
    (``import_error`` empty), the tensors' device and ``dtype_tensors``' dtype."""
    reasons = [] if HAS_TRITON else [f'triton is not importable ({_TRITON_IMPORT_ERROR})']
    if import_error:  # pragma: no cover - e.g. a Triton release without an API we use
        reasons.append(f'the {kernels} Triton kernels failed to import ({import_error})')
    reasons += can_run_device(tensors, interpret=interpret)
    reasons += can_run_dtype(dtype_tensors, dtypes, interpret=interpret, uses_dot=uses_dot)
    return reasons


#: :func:`use_backend`'s choices, innermost last
_chosen: List[str] = []


@contextlib.contextmanager
def use_backend(name: Optional[str]) -> Iterator[None]:
    """Within the block (in this process), every op call that names no backend runs ``name``:
    ``'triton'``, ``'torch'``, ``'reference'``, or ``'auto'``/None for the automatic choice. It
    wins over ``$MMEFFATTN_OPS_BACKEND``; an op's ``backend=`` argument wins over it."""
    _chosen.append(name or 'auto')
    try:
        requested_backend(None)  # an unknown name fails here
        yield
    finally:
        _chosen.pop()


def requested_backend(backend: Optional[str]) -> Optional[str]:
    """The explicit backend: the argument if given, else the innermost :func:`use_backend`,
    else ``$MMEFFATTN_OPS_BACKEND``; None = automatic."""
    source = 'backend'
    if backend is None and _chosen:
        backend, source = _chosen[-1], 'use_backend'
    elif backend is None:
        backend, source = os.environ.get(ENV_VAR) or None, f'${ENV_VAR}'
    if backend is None or backend == 'auto':
        return None
    if backend not in BACKENDS:
        raise ValueError(f'{source}={backend!r} is not a backend; use one of '
                         f'{", ".join(repr(b) for b in BACKENDS)}, \'auto\' or None')
    return backend


def select_backend(op_name: str, backend: Optional[str],
                   triton_reasons: Callable[[], List[str]],
                   tensors: Sequence[torch.Tensor] = ()) -> str:
    """Pick ``'triton'``, ``'torch'`` or ``'reference'`` for one call (rules in the module
    doc); ``tensors`` only decide whether a fallback is logged."""
    backend = requested_backend(backend)
    if backend in ('torch', 'reference'):
        return backend
    reasons = triton_reasons()
    if not reasons:
        return 'triton'
    if backend == 'triton':
        raise RuntimeError(f'{op_name}: the Triton backend was requested but cannot run:\n' +
                           '\n'.join(f'  - {r}' for r in reasons) +
                           "\nUse backend='torch' (or None to choose automatically).")
    if torch.compiler.is_compiling():
        # a logging call would break the dynamo graph at every op
        return 'torch'
    key = (op_name, tuple(reasons))
    if any(t.is_cuda for t in tensors) and key not in _warned:
        _warned.add(key)
        logger.warning('%s: falling back to the PyTorch backend: %s', op_name, '; '.join(reasons))
    else:
        logger.debug('%s: using the PyTorch backend: %s', op_name, '; '.join(reasons))
    return 'torch'


#: the hooks of :func:`dispatch_hook`, innermost last
_hooks: List[Callable] = []


@contextlib.contextmanager
def dispatch_hook(hook: Callable[[str, Callable, tuple, Dict[str, Any]], Any]) -> Iterator[None]:
    """Within the block, every validated public op call goes through ``hook(op_name, run,
    args, kwargs)``, which returns ``run(*args, **kwargs)`` or what stands for it."""
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)


def dispatch(op_name: str, backend: Optional[str], triton_reasons: Callable[[], List[str]],
             tensors: Sequence[torch.Tensor], triton_fn: Callable, torch_fn: Callable,
             reference_fn: Callable, *args, **kwargs):
    """The last step of every public op: run the backend :func:`select_backend` picks,
    through the innermost :func:`dispatch_hook` if any."""
    def run(*args, **kwargs):
        chosen = select_backend(op_name, backend, triton_reasons, tensors)
        fn = {'triton': triton_fn, 'torch': torch_fn, 'reference': reference_fn}[chosen]
        return fn(*args, **kwargs)

    if _hooks:
        return _hooks[-1](op_name, run, args, kwargs)
    return run(*args, **kwargs)
