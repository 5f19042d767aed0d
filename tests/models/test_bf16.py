"""bf16 autocast on the CPU for every registered backbone family (mini archs, the ops' torch
backend): outputs and parameter gradients within bf16's rounding of fp32.

Tolerances, relative L2 per output map (and over all parameter gradients): 2e-2 for the forward
(about 5 bf16 epsilons; measured 4e-3..8e-3), 0.15 for the gradients of a mean-square loss
(measured 4e-2..8e-2: bf16 activations are stored for the backward).
"""
import pytest
import torch

from mmeffattn.models.backbones.base import backbone_families

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

FAMILIES = backbone_families()
FORWARD_TOL, GRAD_TOL = 2e-2, 0.15


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize('name', sorted(FAMILIES))
def test_bf16_autocast_matches_fp32(name):
    cls = FAMILIES[name]
    torch.manual_seed(0)
    model = cls(arch=cls.mini_arch, **{**cls.mini_kwargs, 'drop_path_rate': 0.}).eval()
    x = torch.randn(1, 3, 64, 96)

    def run(bf16: bool):
        model.zero_grad()
        with torch.autocast('cpu', torch.bfloat16, enabled=bf16):
            outs = model(x)
        sum((o.float() ** 2).mean() for o in outs).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return [o.detach() for o in outs], grads

    ref, ref_grads = run(False)
    out, grads = run(True)
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape and torch.isfinite(o).all(), i
        assert rel(o, r) < FORWARD_TOL, (i, rel(o, r))
    assert torch.isfinite(grads).all() and rel(grads, ref_grads) < GRAD_TOL, rel(grads, ref_grads)
