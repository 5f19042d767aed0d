"""Attention dispersion: implied weights per kind, their statistics, probing a model's layer
(from the library alone), and the tool."""
import json
import math
import sys

import pytest
import torch

from mmeffattn.analysis import dispersion as dsp
from tools import analyze_dispersion


def qk(side: int, D: int = 16, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, side * side, D, generator=g, dtype=torch.float64) * scale
    k = torch.randn(1, 2, side * side, D, generator=g, dtype=torch.float64) * scale
    return q, k


@pytest.mark.parametrize('kind', dsp.KINDS)
def test_weights_are_distributions(kind):
    q, k = qk(10)
    rows = dsp.sample_queries(100, 17, seed=1)
    w = dsp.implied_weights(kind, q, k, (10, 10), rows)
    assert w.shape == (1, 2, 17, 100)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 17, dtype=w.dtype))


def test_softmax_window_and_sema_weights():
    q, k = qk(9)
    soft = dsp.implied_weights('softmax', q, k, (9, 9))
    torch.testing.assert_close(soft, torch.softmax(q @ k.transpose(-2, -1) / 4, -1))
    win = dsp.implied_weights('window', q, k, (9, 9), window=7)
    # the query at (8, 8) is in the 2x2 corner window: 4 keys, (7, 7) (8, 7) (7, 8) (8, 8)
    nz = (win[0, 0, 80] > 0).nonzero().flatten().tolist()
    assert nz == [7 * 9 + 7, 7 * 9 + 8, 8 * 9 + 7, 8 * 9 + 8]
    sema = dsp.implied_weights('sema', q, k, (9, 9), window=7)
    torch.testing.assert_close(sema, (win + 1 / 81) / 2)


def test_zero_queries_give_uniform_weights_and_full_entropy():
    q, k = qk(8)
    p = dsp.implied_weights('softmax', torch.zeros_like(q), k, (8, 8))
    s = dsp.dispersion_stats(p)
    assert s['entropy'] == pytest.approx(math.log(64))
    assert s['effective_keys'] == pytest.approx(64) and s['max_weight'] == pytest.approx(1 / 64)
    one_hot = torch.zeros(3, 64, dtype=torch.float64)
    one_hot[:, 5] = 1
    s = dsp.dispersion_stats(one_hot)
    assert s['entropy'] == pytest.approx(0, abs=1e-12) and s['effective_keys'] == \
        pytest.approx(1)


def test_softmax_disperses_with_tokens_while_windows_stay_local():
    """SEMA's argument, with fixed-scale queries and keys: global softmax spreads over more and
    more keys as N grows; a window keeps at most window**2; SEMA sits in between."""
    stats = {}
    for side in (8, 16, 32):
        q, k = qk(side, scale=0.7)
        rows = dsp.sample_queries(side * side, 64)
        stats[side] = {kind: dsp.dispersion_stats(dsp.implied_weights(kind, q, k, (side, side),
                                                                      rows))
                       for kind in ('softmax', 'window', 'sema')}
    eff = {s: {k: v['effective_keys'] for k, v in st.items()} for s, st in stats.items()}
    assert eff[8]['softmax'] < eff[16]['softmax'] < eff[32]['softmax']
    assert stats[8]['softmax']['max_weight'] > stats[32]['softmax']['max_weight']
    assert all(eff[s]['window'] <= 49 for s in eff)
    assert eff[32]['window'] < eff[32]['sema'] < eff[32]['softmax']


def test_core_periphery_routes_through_the_cores():
    q, k = qk(8)
    # identical cores: every patch reaches every patch with the cores' shared distribution
    cores = (torch.zeros(1, 2, 4, 16, dtype=torch.float64),
             torch.zeros(1, 2, 4, 16, dtype=torch.float64))
    w = dsp.implied_weights('core_periphery', q, k, (8, 8), cores=cores)
    torch.testing.assert_close(w, torch.full_like(w, 1 / 64))


def test_bad_kind_and_grid_are_named():
    q, k = qk(4)
    with pytest.raises(ValueError, match="unknown attention kind 'nope'"):
        dsp.implied_weights('nope', q, k, (4, 4))
    with pytest.raises(ValueError, match='do not fill the grid'):
        dsp.implied_weights('softmax', q, k, (4, 5))


def test_tool_on_a_backbone(tmp_path):
    report = analyze_dispersion.main(['--model', 'SEMA-T', '--sizes', '32', '64',
                                      '--max-queries', '16', '--out-dir', str(tmp_path)])
    assert report['layer'] == 'layers.0.blocks.0.attn'
    kinds = list(dsp.KINDS)
    assert [r['kind'] for r in report['results']] == kinds * 2
    assert [r['tokens'] for r in report['results']] == [64] * len(kinds) + [256] * len(kinds)
    saved = json.loads((tmp_path / 'dispersion.json').read_text())
    assert saved['results'] == report['results']
    assert '| 64x64 | 256 | softmax |' in (tmp_path / 'dispersion.md').read_text()
    assert (tmp_path / 'dispersion.png').stat().st_size > 1000
    with pytest.raises(ValueError, match="layer 'nope' is not a module"):
        analyze_dispersion.main(['--model', 'SEMA-T', '--sizes', '32', '--layer', 'nope',
                                 '--out-dir', str(tmp_path)])


def test_probing_works_from_the_library_alone(monkeypatch):
    """find_attention, capture, layer_grid and project_qk on a small SEMA, with the module
    reloaded while any import from tools/ fails."""
    import importlib
    for name in [n for n in sys.modules if n == 'tools' or n.startswith('tools.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, 'tools', None)  # `import tools...` raises
    from mmeffattn.registry import MODELS
    probe = importlib.reload(dsp)
    torch.manual_seed(0)
    model = MODELS.build(dict(type='SEMA', arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                                                     num_heads=[1, 1, 1, 1]))).eval()
    layer, attn = probe.find_attention(model)
    got = probe.capture(model, attn, torch.randn(1, 3, 64, 96), stop=True)
    hw, cores = probe.layer_grid(got, (64, 96), 4)
    q, k = probe.project_qk(attn, got['x'])
    assert (layer, hw, cores, q.shape) == ('layers.0.blocks.0.attn', (16, 24), 0, (1, 1, 384, 16))
    # the captured tokens are the layer's input: its own forward on them runs
    assert attn(got['x'], *got['args'], **got['kwargs']).shape == got['x'].shape
    w = probe.implied_weights('sema', q, k, hw, window=7)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 1, 384))
