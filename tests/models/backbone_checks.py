"""Checks every backbone's tests share (imported by the tests/models files)."""
import copy
from types import ModuleType
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmeffattn.models.backbones import base as backbone_base


def check_norm_state(modules, train_state: bool) -> bool:
    """True if every BatchNorm, and every layer with ``running_statistics`` (what
    ``norm_eval`` freezes), in ``modules`` is in the given training state."""
    return all(m.training == train_state for m in modules
               if isinstance(m, _BatchNorm) or getattr(m, 'running_statistics', False))


def assert_with_cp_equivalent(ref: nn.Module, cp_model: nn.Module, x: torch.Tensor,
                              expected_calls: Optional[int], monkeypatch,
                              cp_module: ModuleType = backbone_base) -> None:
    """``with_cp=True`` changes nothing but memory: same outputs, gradients and buffers as
    ``ref`` (same weights, same RNG seed before each forward), ``expected_calls`` checkpointed
    segments per forward (None: at least one; counted by patching ``cp_module.cp.checkpoint``),
    and none under ``torch.no_grad()``.

    A parameter without a gradient in ``ref`` (e.g. VECA's unused core chunks) must have none
    in ``cp_model`` either.
    """
    calls = []
    real = cp_module.cp.checkpoint
    monkeypatch.setattr(cp_module.cp, 'checkpoint',
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    outs_ref = ref(x)
    torch.manual_seed(0)
    outs_cp = cp_model(x)
    assert len(calls) == expected_calls if expected_calls is not None else calls
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


def freeze_and_train(model: nn.Module, frozen: Sequence[nn.Module],
                     trainable: Sequence[nn.Module], x: torch.Tensor) -> Tuple[dict, dict]:
    """Check a ``frozen_stages`` split of a model in train mode, then take two SGD steps with
    momentum and weight decay (a frozen weight must survive both) on ``x``.

    ``frozen`` modules (and all their submodules) must be in eval mode without trainable
    parameters; ``trainable`` ones in train mode with all parameters trainable. Returns the
    state dict before and after the steps (with no trainable parameter, after a forward).
    """
    for m in frozen:
        assert not m.training and all(not s.training for s in m.modules()), m
        assert all(not p.requires_grad for p in m.parameters()), m
    for m in trainable:
        assert m.training, m
        assert all(p.requires_grad for p in m.parameters()), m
    before = copy.deepcopy(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2)
        for _ in range(2):
            opt.zero_grad()
            sum(o.square().mean() for o in model(x)).backward()
            opt.step()
    else:
        with torch.no_grad():
            model(x)
    return before, model.state_dict()


def assert_pretrained_none_keeps_init(cls: type, **kwargs) -> None:
    """``init_cfg=dict(type='Pretrained', checkpoint=None)`` (what the configs carry to train from
    scratch) initializes exactly as no ``init_cfg`` does, with the same seed."""
    torch.manual_seed(0)
    plain = cls(**kwargs)
    plain.init_weights()
    torch.manual_seed(0)
    model = cls(**kwargs, init_cfg=dict(type='Pretrained', checkpoint=None, prefix='backbone.'))
    model.init_weights()
    for (name, a), b in zip(plain.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
