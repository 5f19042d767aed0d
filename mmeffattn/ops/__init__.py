"""Attention ops. Each op has Triton kernels, a fast PyTorch form (the ``'torch'`` backend, the
CPU default) and a plain reference (``'reference'``, the test oracle); the public function picks
a backend (:mod:`._backend`; :func:`use_backend` chooses one for a block of code) and reports
to :func:`dispatch_hook`. An op folder's files:
docs/adding_an_op.md.

NaN contract (every op, every backend): a NaN in an input element makes exactly the outputs
that depend on it NaN and leaves the others unchanged; an inf follows IEEE arithmetic through
the op's formula; float arguments (``scale``, ``lam``, ``eps``) must be finite. One exception:
in fp32 on the torch backend an attention row whose every logit is -inf comes out 0, not NaN
(torch's fused attention). See docs/advanced/ops.md.
"""
from ._backend import dispatch_hook, use_backend
from ._common import compute_dtype
from .core_periphery import core_periphery_attention, core_periphery_attention_naive
from .dynamic_dwconv import dynamic_dwconv, dynamic_dwconv_naive
from .dynamic_weight import dynamic_weight, dynamic_weight_naive
from .laplacian import laplacian_kernel, laplacian_kernel_naive
from .newton_schulz import newton_schulz_pinv, newton_schulz_pinv_naive, newton_schulz_residual
from .sema import (sema_attention, sema_attention_naive, sema_attention_qk,
                   sema_attention_qk_naive)

__all__ = ['sema_attention', 'sema_attention_naive', 'sema_attention_qk',
           'sema_attention_qk_naive', 'dynamic_weight', 'dynamic_weight_naive',
           'dynamic_dwconv', 'dynamic_dwconv_naive',
           'core_periphery_attention', 'core_periphery_attention_naive',
           'laplacian_kernel', 'laplacian_kernel_naive', 'newton_schulz_pinv',
           'newton_schulz_pinv_naive', 'newton_schulz_residual', 'compute_dtype', 'dispatch_hook',
           'use_backend']
