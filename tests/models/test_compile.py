"""torch.compile on every registered backbone family (mini archs, reference ops on the CPU):
no graph break inside the backbone, compiled outputs equal to eager ones (``compile=True`` through
tools/train.py and tools/test.py: tests/e2e/test_compile_option_e2e.py)."""
import pytest
import torch

from mmeffattn.models.backbones.base import backbone_families
from mmeffattn.ops import _backend

pytestmark = pytest.mark.usefixtures('one_thread', 'torch_ops')

FAMILIES = backbone_families()
NAMES = sorted(FAMILIES)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no graph cached by an earlier test)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def build(name: str) -> torch.nn.Module:
    cls = FAMILIES[name]
    torch.manual_seed(0)
    return cls(arch=cls.mini_arch, **{**cls.mini_kwargs, 'drop_path_rate': 0.}).eval()


@pytest.mark.parametrize('name', NAMES)
def test_no_graph_break_inside_the_backbone(name):
    model = build(name)
    with torch.no_grad():
        report = torch._dynamo.explain(model)(torch.randn(1, 3, 64, 96))
    reasons = [f'{r.reason.splitlines()[0]} at {r.user_stack[-1].filename}:'
               f'{r.user_stack[-1].lineno}' for r in report.break_reasons]
    assert report.graph_break_count == 0 and report.graph_count == 1, reasons


@pytest.mark.parametrize('name', NAMES)
def test_compiled_equals_eager(name):
    """aot_eager runs the traced graph (with its decompositions) without inductor's codegen,
    fast; an odd size exercises the padding paths."""
    model = build(name)
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        ref = model(x)
        got = torch.compile(model, backend='aot_eager', fullgraph=True)(x)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


# WeightFormer broke fullgraph at a second size (a check on a symbolic token count); the others
# with --run-slow (SEMA, with the most size branches, takes ~50 s of dynamo's symbolic shape
# reasoning)
@pytest.mark.parametrize('name', [
    pytest.param(n, marks=() if n == 'WeightFormer' else pytest.mark.slow) for n in NAMES])
def test_dynamic_sizes_share_one_graph(name, monkeypatch):
    """dynamic=True, fullgraph=True: four sizes compile once and equal eager. The sizes share
    what the models branch on for speed: none a multiple of 4 (the stem pads), every stage grid
    padded to SEMA's 7x7 windows, at least two windows per stage, no side of 1; and torch's own
    convolution heuristics (a size threshold) decide alike for all. Non-square first (duck
    sizing would tie H to W)."""
    from torch._dynamo.utils import counters
    # the torch backend (what a CPU runs): the graph is the subject here, and the interpreted
    # kernels the test harness turns on would take a minute at these sizes
    monkeypatch.setenv('MMEFFATTN_OPS_BACKEND', 'torch')
    model = build(name)
    compiled = torch.compile(model, backend='eager', dynamic=True, fullgraph=True)
    counters.clear()
    with torch.no_grad():
        for hw in [(258, 270), (257, 262), (270, 263), (263, 258)]:
            x = torch.randn(1, 3, *hw)
            for g, r in zip(compiled(x), model(x)):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    assert counters['stats']['unique_graphs'] == 1


@pytest.mark.slow
def test_inductor_equals_eager_on_the_smallest_backbone():
    """Inductor's generated code on one family (a minute of compilation on a shared CPU)."""
    model = build('VECA')
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        got = torch.compile(model)(x)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_veca_nested_dropout_compiles_one_graph_per_budget():
    """VECA's nested core dropout in training: the budget drawn before each step
    (``draw_for_next_forward``, what the compiled tools call) is the one the compiled forward
    uses, with no graph break: one graph per budget (the budget picks which core chunks take
    part, so it stays a constant of the graph), none for a budget seen before."""
    cls = FAMILIES['VECA']
    torch.manual_seed(0)
    model = cls(arch=cls.mini_arch, **{**cls.mini_kwargs, 'drop_path_rate': 0.,
                                       'nested_dropout': True}).train()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(1, 3, 32, 48)
    compiled = torch.compile(model, backend=backend)
    drawn = []
    for step in range(6):
        torch.manual_seed(step)
        model.draw_for_next_forward()
        drawn.append(model._drawn_num_cores)
        torch.manual_seed(100)  # training jitters the patch positions (RoPE augmentation)
        got = compiled(x)
        assert model._drawn_num_cores is None  # used once
        model._drawn_num_cores = drawn[-1]  # the same budget, eager
        torch.manual_seed(100)
        ref = model(x)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    assert len(set(drawn)) < len(drawn), drawn  # a budget repeats (seeded)
    assert len(graphs) == len(set(drawn)), f'{len(graphs)} graphs for budgets {drawn}'


def test_automatic_backend_choice_does_not_break_the_graph(monkeypatch):
    """Without ``$MMEFFATTN_OPS_BACKEND`` (what tools/train.py runs with), each op chooses its
    backend and logs a fallback to the torch backend; under ``torch.compile`` that log call broke
    the graph at every op. The choice itself must still be the torch backend."""
    monkeypatch.delenv('MMEFFATTN_OPS_BACKEND', raising=False)

    def call(x: torch.Tensor) -> torch.Tensor:
        chosen = _backend.select_backend('op', None, lambda: ['no GPU'], (x,))
        return x + 1 if chosen == 'torch' else x - 1

    out = torch.compile(call, backend='eager', fullgraph=True)(torch.zeros(3))
    torch.testing.assert_close(out, torch.ones(3))
