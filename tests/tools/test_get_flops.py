"""FLOP counting: the published figures at 224x224 (MLLA README: MILA-T 25M, 4.2G; Swin-T 4.5G,
ResNet-50 4.1G, DeiT-S 4.6G from their papers), and the analytic op counts against the
references' traced matmuls."""
import os.path as osp

import pytest
import torch

import mmeffattn.ops as ops
from mmeffattn.analysis import MODEL_ZOO, CountedForward, build_classifier, count_flops
from mmeffattn.analysis.flops import OP_COUNTERS, op_macs, sdpa_macs
from mmeffattn.ops import _backend
from tools.analysis_tools.get_flops import count, main

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

_counted = {}


def cached_count(config: str, shape=(224, 224)) -> dict:
    """One count per (config, shape) for the whole module (a build and trace takes seconds)."""
    key = (config, tuple(shape))
    if key not in _counted:
        _counted[key] = count(osp.join(ROOT, config), shape)
    return _counted[key]


def test_mila_t_matches_published():
    r = cached_count('configs/mila/mila-t_8xb128_in1k.py')
    assert r['what'] == 'classifier'
    # The official MLLA-T classifier has exactly 24,392,200 parameters (README rounds to 25M).
    assert r['params'] == 24_392_200
    assert r['flops'] == pytest.approx(4.2e9, rel=0.05)


def test_sema_t_adds_value_projection_and_window_attention():
    mila = cached_count('configs/mila/mila-t_8xb128_in1k.py')
    sema = cached_count('configs/sema/sema-t_8xb128_in1k.py')
    # one dim x dim value projection (+ bias) per block: depths 2-4-8-4 at 64-128-256-512
    v_proj = sum(d * (c * c + c) for d, c in zip((2, 4, 8, 4), (64, 128, 256, 512)))
    assert sema['params'] - mila['params'] == v_proj
    assert sema['params'] == pytest.approx(26e6, rel=0.03)  # "about 26M" (SEMA paper)
    assert sema['flops'] > mila['flops']
    # the SEMA op (its packed entry point, as the backbone calls it) is counted analytically,
    # once per block: 56x56, 28x28, 14x14, 7x7 grids (windows of 7 tile them exactly), head
    # dim 32
    expected = sum(d * (hw * hw * 49 * 2 * c + hw * hw * c)
                   for d, hw, c in zip((2, 4, 8, 4), (56, 28, 14, 7), (64, 128, 256, 512)))
    assert sema['ops'] == {'sema_attention_qk': expected}


def test_every_family_counts_its_ops():
    """Each family's ops run as counted nodes under the trace, sizes read from ``x.shape``
    included (WeightFormer's ``n_tokens`` arrives as a traced 0-dim tensor)."""
    expected = {'configs/weightformer/weightformer-s_8xb256_in1k.py': {'dynamic_weight',
                                                                       'dynamic_dwconv'},
                'configs/laplacianformer/laplacianformer-t_8xb128_in1k.py': {
                    'laplacian_kernel', 'newton_schulz_pinv'},
                'configs/veca/veca-s_8xb128_in1k.py': {'core_periphery_attention'}}
    for config, names in expected.items():
        r = cached_count(config, (64, 64))
        assert set(r['ops']) == names and all(v > 0 for v in r['ops'].values()), r['ops']


@pytest.mark.parametrize('name', ['Swin-T', 'ResNet-50', 'DeiT-S'])
def test_peers_match_published(name):
    model = CountedForward(build_classifier(name))
    assert model.what == 'classifier'
    r = count_flops(model, (torch.randn(1, 3, 224, 224), ))
    assert r.total == pytest.approx(MODEL_ZOO[name].published_gflops * 1e9, rel=0.05)
    assert r.ops == {}  # no mmeffattn op in a peer


def test_backbone_only_for_detectors(capsys):
    main([osp.join(ROOT, 'configs/mask_rcnn_sema_t_3x.py'), '--shape', '64', '96'])
    out = capsys.readouterr().out
    assert 'backbone at 64x96' in out and 'sema_attention_qk' in out
    assert not _backend._hooks  # the counting hook is gone after the count


def _traced_matmul_macs(fn, *args) -> int:
    """What mmengine's analyzer counts for a plain PyTorch function (matmuls, SDPA)."""
    from mmengine.analysis import FlopAnalyzer

    from mmeffattn.analysis.flops import sdpa_flop_jit

    class Wrap(torch.nn.Module):
        def forward(self, *tensors):
            return fn(*tensors)

    analyzer = FlopAnalyzer(Wrap(), args)
    analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_jit)
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    analyzer.tracer_warnings('none')
    return analyzer.total()


def test_sema_count_equals_reference_sdpa_on_exact_windows():
    q, k, v = (torch.randn(2, 3, 14 * 21, 16) for _ in range(3))
    traced = _traced_matmul_macs(
        lambda q, k, v: ops.sema_attention_naive(q, k, v, (14, 21), 7, with_mean=False), q, k, v)
    assert op_macs('sema_attention', q, k, v, (14, 21), 7, with_mean=False) == traced
    # a partial last window: only real pairs count, fewer than the padded reference computes
    q, k, v = (torch.randn(1, 2, 9 * 10, 16) for _ in range(3))
    real = op_macs('sema_attention', q, k, v, (9, 10), 7, with_mean=False)
    assert real == 2 * (49 ** 2 + 21 ** 2 + 14 ** 2 + 6 ** 2) * 2 * 16
    assert real < _traced_matmul_macs(
        lambda q, k, v: ops.sema_attention_naive(q, k, v, (9, 10), 7, with_mean=False), q, k, v)
    # the packed entry point counts the same op
    qk = torch.stack([q, k], 2).transpose(1, 3)  # [B, N, 2, heads, D]
    assert op_macs('sema_attention_qk', qk, v, (9, 10), 7, with_mean=False) == real
    assert op_macs('sema_attention_qk', qk, v, (9, 10), 7) == \
        op_macs('sema_attention', q, k, v, (9, 10), 7)


def test_counters_of_weightformer_ops():
    u, v = torch.randn(2, 49, 24), torch.randn(2, 49, 40)
    assert op_macs('dynamic_weight', u, v, 196) == 2 * 40 * 24 * 50
    x, kern = torch.randn(2, 8, 9, 11), torch.randn(2, 8, 3, 3)
    assert op_macs('dynamic_dwconv', x, kern) == _traced_matmul_macs(
        lambda x, w: torch.nn.functional.conv2d(x.reshape(1, 16, 9, 11), w.reshape(16, 1, 3, 3),
                                                padding=1, groups=16), x, kern)


def test_core_periphery_and_laplacian_counts():
    q = torch.randn(1, 2, 8 + 30, 16)
    dense = sdpa_macs(2, 38, 38, 16, 16)
    cp = op_macs('core_periphery_attention', q, q, q, 8)
    assert cp == sdpa_macs(2, 8, 38, 16, 16) + sdpa_macs(2, 30, 8, 16, 16) < dense
    x, y = torch.randn(1, 2, 30, 16), torch.randn(1, 2, 5, 16)
    assert op_macs('laplacian_kernel', x, y, 1.0) == 2 * 30 * 5 * 16
    a = torch.randn(3, 2, 5, 5)
    assert op_macs('newton_schulz_pinv', a, 6, 1e-6) == 6 * 6 * 2 * 5 ** 3


@pytest.mark.parametrize('name', ['newton_schulz_pinv', 'core_periphery_attention'])
def test_counters_match_the_references_matmuls(name):
    naive = getattr(ops, f'{name}_naive')
    if name == 'newton_schulz_pinv':
        a = torch.randn(1, 2, 6, 6)
        a = a @ a.transpose(-1, -2)
        traced = _traced_matmul_macs(lambda a: naive(a, 4, 1e-6), a)
        assert op_macs(name, a, 4, 1e-6) == traced
    elif name == 'core_periphery_attention':
        q, k, v = (torch.randn(1, 2, 8 + 20, 16) for _ in range(3))
        traced = _traced_matmul_macs(lambda q, k, v: naive(q, k, v, 8), q, k, v)
        assert op_macs(name, q, k, v, 8) == traced


def test_every_public_op_has_a_counter():
    # the ops are the public functions with a reference (diagnostics such as
    # newton_schulz_residual are not model ops)
    public = [n for n in ops.__all__ if f'{n}_naive' in ops.__all__]
    assert len(public) >= 3
    assert set(public) <= set(OP_COUNTERS), set(public) - set(OP_COUNTERS)


def test_unknown_op_is_named():
    with pytest.raises(KeyError, match='no FLOP counter for op'):
        op_macs('nope')


@pytest.mark.slow
def test_zoo_table_matches_every_published_figure():
    from tools.analysis_tools.get_flops import zoo_table
    table = zoo_table()
    rows = {line.split('|')[1].strip(): line.split('|') for line in table.splitlines()[2:]}
    for name, entry in MODEL_ZOO.items():
        if entry.published_gflops:
            assert float(rows[name][4]) == pytest.approx(entry.published_gflops, rel=0.05)
    if 'VECA-S-C8' in rows and 'not available' not in rows['VECA-S-C8'][3]:
        # more cores, more tokens through every layer
        assert float(rows['VECA-S-C8'][4]) < float(rows['VECA-S-C16'][4]) < \
            float(rows['VECA-S-C64'][4])
