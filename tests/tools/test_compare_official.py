"""Tests of tools/analysis_tools/compare_official.py. The official checkouts are not in the
project: the timing plumbing runs on stand-ins (with ``--no-check``, as their weights cannot be
ours), and the output check on small models that agree or disagree on purpose."""
import json
import sys
import textwrap
import time

import pytest
import torch
import torch.nn as nn

from mmeffattn.analysis import comparison
from tools.analysis_tools import compare_official

FAKE_MLLA = '''
import torch.nn as nn
class MLLA(nn.Module):
    def __init__(self, img_size, embed_dim, depths, num_heads, drop_path_rate=0.1):
        super().__init__()
        assert drop_path_rate == 0  # the tool turns stochastic depth off
        self.img_size, self.proj = img_size, nn.Conv2d(3, embed_dim, 4, 4)
    def forward_features(self, x):
        assert x.shape[-1] == self.img_size
        return self.proj(x).mean((2, 3))
'''
FAKE_VECA_CONFIG = '''
class PretrainConfig:
    model_family = 'small'
def apply_family_preset(cfg):
    cfg.num_query_tokens = 64
'''
FAKE_VECA_MODEL = '''
import torch.nn as nn
class VECA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.init_patch_from_dinov3 is False and cfg.num_query_tokens == 64
        self.proj = nn.Conv2d(3, 8, 16, 16)
    def forward(self, x):
        return self.proj(x).mean((2, 3))
'''
FAKE_WFM = '''
import torch.nn as nn
class VisionTransformer(nn.Module):
    def __init__(self, img_size, patch_size, embed_dim, depth):
        super().__init__()
        assert (patch_size, depth) == (16, 17) and embed_dim in (192, 384)
        self.img_size, self.proj = img_size, nn.Conv2d(3, embed_dim, 16, 16)
    def forward_features(self, x):
        assert x.shape[-1] == self.img_size
        return self.proj(x).mean((2, 3))
'''


@pytest.fixture
def fake_roots(tmp_path, monkeypatch):
    mlla = tmp_path / 'MLLA' / 'models'
    mlla.mkdir(parents=True)
    (mlla / 'mlla.py').write_text(textwrap.dedent(FAKE_MLLA))
    veca = tmp_path / 'VECA' / 'veca'
    veca.mkdir(parents=True)
    (veca / '__init__.py').write_text('')
    (veca / 'config.py').write_text(textwrap.dedent(FAKE_VECA_CONFIG))
    (veca / 'model.py').write_text(textwrap.dedent(FAKE_VECA_MODEL))
    wfm = tmp_path / 'WeightFormer' / 'model'
    wfm.mkdir(parents=True)
    (wfm / 'wfm.py').write_text(textwrap.dedent(FAKE_WFM))
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the tool extends sys.path
    for name in ('veca', 'veca.config', 'veca.model', 'official_mlla', 'official_wfm'):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return str(tmp_path / 'MLLA'), str(tmp_path / 'VECA'), str(tmp_path / 'WeightFormer')


class _Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def test_times_ours_against_the_official_models(fake_roots, capsys, tmp_path):
    mlla_root, veca_root, wfm_root = fake_roots
    out_json = tmp_path / 'rows.json'
    rows = compare_official.main(['--mlla-root', mlla_root, '--veca-root', veca_root,
                                  '--weightformer-root', wfm_root, '--no-check',
                                  '--sizes', '64', '--rounds', '2',
                                  '--threads', '1', '--json', str(out_json)])
    assert [r['reference'] for r in rows] == ['official MLLA-T', 'official VECA-small',
                                              'official WeightFormer-T',
                                              'official WeightFormer-S']
    assert set(rows[0]['ms']) == {'official MLLA-T', 'MILA-T', 'SEMA-T'}
    assert set(rows[1]['ms']) == {'official VECA-small', 'VECA-small'}
    assert set(rows[3]['ms']) == {'official WeightFormer-S', 'WeightFormer-S'}
    assert all(v > 0 for r in rows for v in r['ms'].values())
    assert all(r['output_diff'] == {} for r in rows)  # --no-check
    out = capsys.readouterr().out
    assert '64x64: official MLLA-T' in out and '(1.00x)' in out
    assert json.loads(out_json.read_text())['rows'] == rows


def test_times_training_steps(fake_roots):
    mlla_root, veca_root, wfm_root = fake_roots
    rows = compare_official.main(['--mlla-root', mlla_root, '--veca-root', veca_root,
                                  '--weightformer-root', wfm_root, '--no-check', '--train',
                                  '--sizes', '64', '--rounds', '2',
                                  '--threads', '1'])
    assert {r['mode'] for r in rows} == {'train'} and len(rows) == 4
    assert all(v > 0 for r in rows for v in r['ms'].values())


def test_training_step_runs_backward_in_train_mode():
    model = _Affine().eval()
    x = torch.randn(3, 8)
    cmp = compare_official.Comparison({'m': lambda: (model(x), [model(x) * 2])}, {'m': model})
    cmp.training_steps()['m']()
    assert model.training
    # d/dW of sum(y) + sum(2y) = 3 * (column sums of x), for each output row
    assert torch.allclose(model.fc.weight.grad, 3 * x.sum(0).expand(4, 8))


def test_paired_timing_alternates_calls_and_pairs_the_ratios():
    calls = []

    def sleeper(name, secs):
        def fn():
            calls.append(name)
            time.sleep(secs)
        return fn

    ms, ratio = comparison.time_paired({'a': sleeper('a', .002), 'b': sleeper('b', .006)},
                                             rounds=4)
    assert calls == ['a', 'b'] + ['a', 'b', 'b', 'a', 'a', 'b', 'b', 'a']  # warm-up, 4 rounds
    assert ratio['a'] == 1.0 and 2 < ratio['b'] < 4.5
    assert ms['b'] > ms['a'] >= 2


def test_stand_ins_fail_the_output_check(fake_roots):
    # by default ours must load the official weights: a stand-in's cannot be loaded
    with pytest.raises(RuntimeError, match='Missing key'):
        compare_official.main(['--weightformer-root', fake_roots[2], '--sizes', '64'])


def test_output_check_accepts_the_same_network():
    x = torch.randn(3, 8)
    off, ours = compare_official.perturb_(_Affine()), _Affine()
    ours.load_state_dict(off.state_dict())
    diffs = comparison.check_outputs({'official': lambda: off(x), 'ours': lambda: ours(x)},
                                           tol=1e-6)
    assert diffs == {'ours': 0.0}


def test_output_check_rejects_other_weights_and_shapes():
    x = torch.randn(3, 8)
    off, ours = _Affine(), _Affine()
    ours.load_state_dict(off.state_dict())
    compare_official.perturb_(ours, seed=1)  # one noisy copy: no longer the official weights
    with pytest.raises(RuntimeError, match=r'ours differs by .* \(relative; --tol 0.0001\)'):
        comparison.check_outputs({'official': lambda: off(x), 'ours': lambda: ours(x)},
                                       tol=1e-4)
    with pytest.raises(RuntimeError, match=r'shape \(3, 2\).*\(3, 4\): not the same model'):
        comparison.check_outputs({'official': lambda: off(x),
                                        'ours': lambda: ours(x)[:, :2]}, tol=1e-4)


def test_perturb_is_seeded_and_moves_every_parameter():
    a, b = _Affine(), _Affine()
    b.load_state_dict(a.state_dict())
    before = {k: v.clone() for k, v in a.state_dict().items()}
    compare_official.perturb_(a, seed=3)
    compare_official.perturb_(b, seed=3)
    for k, v in a.state_dict().items():
        assert not torch.equal(v, before[k]) and torch.equal(v, b.state_dict()[k])


def test_missing_checkout_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='official checkout'):
        compare_official.main(['--mlla-root', str(tmp_path), '--sizes', '64'])


def test_needs_a_checkout():
    with pytest.raises(SystemExit):
        compare_official.main([])
