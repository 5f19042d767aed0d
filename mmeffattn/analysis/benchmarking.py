"""Measurement helpers shared by ``tools/benchmark.py`` and ``tools/benchmark_ops.py``: timing
(median after warm-up, CUDA events on a GPU), peak tensor memory, the machine's matmul rate,
scaling-exponent fits and the environment record that goes with every result."""
import math
import platform
import statistics
import time
import weakref
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ['PeakTensorMemory', 'peak_memory', 'time_once', 'backward_of_outputs', 'median',
           'fit_exponent', 'environment', 'matmul_flops_per_s', 'is_oom', 'synchronize',
           'grid_tokens', 'parse_size', 'predict_power_law', 'copy_bandwidth', 'MEMORY_METHOD']

#: how memory is measured, stated in every output
MEMORY_METHOD = {
    'cpu': ('peak tensor memory: parameters, buffers and inputs plus the peak of the tensors '
            'alive during the call, tracked per storage by a torch dispatch mode (allocator '
            'caching and fragmentation not included)'),
    'cuda': 'torch.cuda.max_memory_allocated during the call (the caching allocator\'s peak)',
}


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class PeakTensorMemory(TorchDispatchMode):
    """Tracks the bytes of tensor storages created inside the block and released again, and
    their peak (``peak``). Views of an existing storage are not new memory and are skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: set = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._alive.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._alive:
                continue  # a view (or an in-place result) of memory already counted
            self._alive.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            # storages keep their Python object for their whole life (PyObject preservation),
            # so the finalizer runs exactly when the memory is released
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def _bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: Dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_memory(fn: Callable[[], Any], resident: Sequence[torch.Tensor],
                device: torch.device) -> int:
    """Peak bytes while ``fn()`` runs: on CUDA the allocator's peak; elsewhere the bytes of
    ``resident`` (parameters, inputs) plus the peak of the tensors ``fn`` creates."""
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with PeakTensorMemory() as tracker:
        fn()
    return _bytes(resident) + tracker.peak


def time_once(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one ``fn()``: CUDA events on a GPU (host overhead excluded from the queue
    wait), ``perf_counter`` around the call otherwise."""
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def backward_of_outputs(out: Any) -> None:
    """Backward of the sum of a model's outputs (a tensor or any nest of them; other leaves are
    ignored): the stand-in loss of a timed training step."""
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    sum(t.float().sum() for t in leaves).backward()


def median(xs: Sequence[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Least-squares slope of ``log y`` against ``log x`` (y ~ x^k); None with < 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def is_oom(e: BaseException) -> bool:
    """Out of memory on any device (CUDA's OutOfMemoryError or an allocator's message)."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    msg = str(e).lower()
    return isinstance(e, RuntimeError) and ('out of memory' in msg or
                                            'failed to allocate' in msg or
                                            "can't allocate memory" in msg)


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype = torch.float32,
                       n: int = 0, repeats: int = 5) -> Dict[str, Any]:
    """The machine's practical limit: FLOP/s (2 per MAC) of a square matmul, the median of
    ``repeats`` runs after one warm-up. ``n`` defaults to 2048 on CPU and 8192 on CUDA."""
    n = n or (8192 if device.type == 'cuda' else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    time_once(lambda: a @ b, device)
    secs = median([time_once(lambda: a @ b, device) for _ in range(repeats)])
    return dict(n=n, dtype=str(dtype).replace('torch.', ''), seconds=secs,
                flops_per_s=2 * n ** 3 / secs)


def environment(device: torch.device, dtype: torch.dtype) -> Dict[str, Any]:
    """What a reader needs to reproduce or discount a result."""
    from mmeffattn.ops import _backend
    env = dict(torch=torch.__version__, python=platform.python_version(),
               machine=platform.machine(), processor=platform.processor() or platform.machine(),
               device=str(device), dtype=str(dtype).replace('torch.', ''),
               threads=torch.get_num_threads(), triton=_backend.HAS_TRITON,
               triton_interpreter=_backend.TRITON_INTERPRET,
               memory_method=MEMORY_METHOD['cuda' if device.type == 'cuda' else 'cpu'],
               time=time.strftime('%Y-%m-%d %H:%M:%S %Z'))
    if _backend.HAS_TRITON:  # the compiled code, and so the speed, depends on its version
        import triton
        env['triton_version'] = triton.__version__
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   capability=f'{props.major}.{props.minor}')
    return env


def grid_tokens(size: Tuple[int, int], stride: int = 16) -> int:
    """Tokens of a ``stride`` x ``stride`` patch grid over an ``H x W`` image (rounded up)."""
    return math.ceil(size[0] / stride) * math.ceil(size[1] / stride)


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> ``(512, 512)``, ``'512x768'`` -> ``(512, 768)`` (height x width)."""
    try:
        parts = [int(p) for p in str(text).lower().split('x')]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) < 1:
        raise ValueError(f'size {text!r} is not N or HxW with positive integers (e.g. 512 or '
                         f'512x768)')
    return parts[0], parts[1]


def predict_power_law(history: Sequence[Tuple[float, float]], x: float,
                      min_exponent: float = 1.0) -> float:
    """Extrapolate a cost to ``x`` from ``(x, cost)`` pairs measured at smaller ``x``: a power
    law through the last two points, with an exponent of at least ``min_exponent`` (so a noisy
    flat start does not promise a free large size); 0 without history."""
    if not history:
        return 0.
    k = fit_exponent(*zip(*history[-2:])) if len(history) >= 2 else None
    k = max(min_exponent, k if k is not None else min_exponent)
    x0, c0 = history[-1]
    return c0 * (x / x0) ** k if x > x0 else c0


def copy_bandwidth(device: torch.device, nbytes: int = 0, repeats: int = 5) -> Dict[str, Any]:
    """The machine's practical memory bandwidth: bytes read + written per second by a large
    tensor copy (64 MiB on CPU, 1 GiB on CUDA by default), median after one warm-up."""
    nbytes = nbytes or (2**30 if device.type == 'cuda' else 2**26)
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    time_once(lambda: dst.copy_(src), device)
    secs = median([time_once(lambda: dst.copy_(src), device) for _ in range(repeats)])
    return dict(bytes=nbytes, seconds=secs, bytes_per_s=2 * nbytes / secs)
