"""Checks every backbone's tests share (imported by the tests/models files)."""
from types import ModuleType

import torch
import torch.nn as nn


def assert_with_cp_equivalent(ref: nn.Module, cp_model: nn.Module, cp_module: ModuleType,
                              x: torch.Tensor, expected_calls: int, monkeypatch) -> None:
    """``with_cp=True`` changes nothing but memory: same outputs, gradients and buffers as
    ``ref`` (same weights), ``expected_calls`` checkpointed segments per forward (counted by
    patching ``cp_module.cp.checkpoint``), and none under ``torch.no_grad()``.

    A parameter without a gradient in ``ref`` (e.g. VECA's unused core chunks) must have none
    in ``cp_model`` either.
    """
    calls = []
    real = cp_module.cp.checkpoint
    monkeypatch.setattr(cp_module.cp, 'checkpoint',
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    outs_ref, outs_cp = ref(x), cp_model(x)
    assert len(calls) == expected_calls
    for a, b in zip(outs_ref, outs_cp):
        torch.testing.assert_close(a, b)
    sum(o.square().mean() for o in outs_ref).backward()
    sum(o.square().mean() for o in outs_cp).backward()
    grads_cp = dict(cp_model.named_parameters())
    for name, p in ref.named_parameters():
        if p.grad is None:
            assert grads_cp[name].grad is None, name
        else:
            torch.testing.assert_close(p.grad, grads_cp[name].grad, rtol=1e-4, atol=1e-6,
                                       msg=name)
    # e.g. running statistics: the recomputation in backward must not update them twice
    for (name, a), b in zip(ref.named_buffers(), cp_model.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    calls.clear()
    with torch.no_grad():  # no gradients needed: no checkpointing
        cp_model(x)
    assert not calls
