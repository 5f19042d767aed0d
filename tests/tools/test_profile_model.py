"""tools/analysis_tools/profile_model.py and mmeffattn.analysis.profiling: op classes, module
attribution, the CLI's JSON."""
import json

import pytest
import torch
import torch.nn as nn

from mmeffattn.analysis.profiling import OP_CLASSES, op_class, profile_model
from tools.analysis_tools import profile_model as cli

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.mark.parametrize('name, cls', [
    ('aten::addmm', 'matmul'), ('aten::bmm', 'matmul'),
    ('aten::mkldnn_convolution', 'conv'), ('aten::convolution_backward', 'conv'),
    ('aten::_scaled_dot_product_flash_attention_for_cpu', 'attention'),
    ('aten::_softmax', 'attention'), ('aten::copy_', 'copy/layout'),
    ('aten::constant_pad_nd', 'copy/layout'), ('aten::fill_', 'copy/layout'),
    ('aten::add_', 'elementwise'), ('aten::gelu_backward', 'elementwise'),
    ('aten::native_layer_norm', 'norm'), ('aten::native_batch_norm_backward', 'norm'),
    ('Torch-Compiled Region: 0/0', 'compiled'), ('aten::empty', 'other')])
def test_op_class(name, cls):
    assert op_class(name) == cls


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.conv(x).flatten(2).transpose(1, 2).contiguous()  # a copy in the Toy's own time
        return self.fc(t)


@pytest.mark.parametrize('backward', [False, True])
def test_classes_and_modules(backward):
    model = Toy()
    res = profile_model(model, torch.randn(1, 3, 32, 32), backward=backward)
    assert set(res['classes']) == set(OP_CLASSES)
    assert sum(v['share'] for v in res['classes'].values()) == pytest.approx(1, abs=1e-3)
    for cls in ('matmul', 'conv', 'copy/layout'):
        assert res['classes'][cls]['ms'] > 0, cls
    ops = {o['name']: o for o in res['ops']}
    assert ops['aten::addmm']['calls'] == 1 and ops['aten::addmm']['op_class'] == 'matmul'
    modules = {m['name'] for m in res['modules']}
    assert {'Toy (Toy)', 'conv (Conv2d)', 'fc (Linear)'} <= modules
    # exclusive times: the copy is the Toy's own, the matmul the Linear's
    types = {m['name']: m['ms'] for m in res['module_types']}
    assert types['Toy'] > 0 and types['Linear'] > 0 and types['Conv2d'] > 0
    assert not any(h for h in model._forward_hooks.values())  # the hooks are removed
    if backward:
        assert '(outside modules)' in modules  # the backward runs outside the forward hooks


def test_copy_inside_a_compute_op_counts_as_that_op():
    """addmm copies the bias into its output: that copy is the matmul's, not layout glue (the op
    table still lists the raw aten::copy_)."""
    res = profile_model(nn.Linear(16, 64), torch.randn(1, 256, 16))
    ops = {o['name']: o for o in res['ops']}
    assert ops['aten::copy_']['ms'] > 0 and ops['aten::copy_']['op_class'] == 'copy/layout'
    assert res['classes']['copy/layout']['ms'] == 0 and res['classes']['matmul']['ms'] > 0


def test_cli_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('MMEFFATTN_OPS_BACKEND', 'torch')  # (restored after: the CLI sets it)
    out = tmp_path / 'p.json'
    res = cli.main(['SEMA-T', '--size', '64', '--threads', '1', '--json', str(out), '--top', '5'])
    printed = capsys.readouterr().out
    assert 'op class' in printed and 'SEMABlock' in printed
    saved = json.loads(out.read_text())
    assert saved['settings']['model'] == 'SEMA-T' and saved['settings']['size'] == [64, 64]
    assert saved['classes']['conv']['ms'] > 0 and len(saved['ops']) == 5
    assert saved['total_ms'] == res['total_ms']
