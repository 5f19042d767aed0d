"""Mixed precision on the CPU, where mmengine's ``AmpOptimWrapper`` refuses to run: bf16
autocast (fp32's exponent range, so no loss scaling)."""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper

from ..registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAutocastOptimWrapper(OptimWrapper):
    """An ``OptimWrapper`` that runs the forward pass under ``torch.autocast('cpu', dtype)``,
    ``dtype`` ``'bfloat16'`` (default) or ``'float16'``; ``**kwargs`` go to ``OptimWrapper``."""

    def __init__(self, dtype: str = 'bfloat16', **kwargs) -> None:
        super().__init__(**kwargs)
        if dtype not in ('bfloat16', 'float16'):
            raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {dtype!r}")
        self.cast_dtype = getattr(torch, dtype)

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
