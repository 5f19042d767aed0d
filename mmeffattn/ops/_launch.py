"""Launch plumbing of every op's launchers (``<op>/function.py``): a launch is a
:class:`KernelConfig` started by :func:`launch`; inside :func:`record_launches` launches are
recorded instead of run, so the ahead-of-time compile tests compile exactly what runs."""
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.library import wrap_triton

from ._backend import TRITON_INTERPRET

#: profiler range around an interpreted launch (its aten calls are left out of glue profiles)
INTERPRETED_LAUNCH = 'mmeffattn::interpreted_launch'


@dataclass(frozen=True)
class KernelConfig:
    """One kernel launch configuration: the kernel, its constexprs, num_warps, num_stages and
    an optional register cap per thread (``maxnreg``, None = ptxas decides)."""
    kernel: Any
    constexprs: Dict[str, Any]
    num_warps: int
    num_stages: int
    maxnreg: Optional[int] = None

    @property
    def launch_options(self) -> Dict[str, Any]:
        options = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.maxnreg is not None:
            options['maxnreg'] = self.maxnreg
        return options


@dataclass
class Launch:
    """A recorded kernel launch: ``config.kernel[grid](*args, **config.constexprs, ...)``."""
    role: str
    config: KernelConfig
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]


#: :func:`record_launches`' list, per thread (not another thread's eager launches)
_state = threading.local()


def _recorder() -> Optional[List[Launch]]:
    return getattr(_state, 'recorder', None)


@contextlib.contextmanager
def record_launches() -> Iterator[List[Launch]]:
    """Within the block, this thread's launchers record their launches in the yielded list
    and run nothing (to compile exactly what they launch)."""
    previous = _recorder()
    _state.recorder = launches = []
    try:
        yield launches
    finally:
        _state.recorder = previous


def launch(role: str, config: KernelConfig, grid: Tuple[int, ...], *args: Any) -> None:
    """Launch ``config.kernel`` on ``grid`` (or record it inside :func:`record_launches` in this
    thread)."""
    recorder = _recorder()
    if recorder is not None:
        recorder.append(Launch(role, config, grid, args))
        return
    # traced inside a ``torch.library.triton_op`` (torch.compile/export), the launch becomes a
    # node of the graph (``_library.py``); eager calls launch the kernel directly
    traced = any(isinstance(a, torch.Tensor) and is_fake(a) for a in args)
    kernel = wrap_triton(config.kernel) if traced else config.kernel
    with (torch.profiler.record_function(INTERPRETED_LAUNCH) if TRITON_INTERPRET and not traced
          else contextlib.nullcontext()):
        kernel[grid](*args, **config.constexprs, **config.launch_options)


def next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def device_guard(x: torch.Tensor):
    """Launch on ``x``'s GPU (Triton launches on the current device)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
