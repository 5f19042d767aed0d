"""Smoke test of tools/analysis_tools/compare_official.py on stand-ins for the official checkouts
(the real ones are not in the project): the plumbing, not the official models."""
import os.path as osp
import sys
import textwrap

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis_tools'))

import compare_official  # noqa: E402

FAKE_MLLA = '''
import torch.nn as nn
class MLLA(nn.Module):
    def __init__(self, img_size, embed_dim, depths, num_heads):
        super().__init__()
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
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the tool extends sys.path
    for name in ('veca', 'veca.config', 'veca.model', 'official_mlla'):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return str(tmp_path / 'MLLA'), str(tmp_path / 'VECA')


def test_times_ours_against_the_official_models(fake_roots, capsys):
    mlla_root, veca_root = fake_roots
    rows = compare_official.main(['--mlla-root', mlla_root, '--veca-root', veca_root,
                                  '--sizes', '64', '--blocks', '2', '--runs', '1',
                                  '--threads', '1'])
    assert [r['reference'] for r in rows] == ['official MLLA-T', 'official VECA-small']
    assert set(rows[0]['ms']) == {'official MLLA-T', 'MILA-T', 'SEMA-T'}
    assert set(rows[1]['ms']) == {'official VECA-small', 'VECA-small'}
    assert all(v > 0 for r in rows for v in r['ms'].values())
    out = capsys.readouterr().out
    assert '64x64: official MLLA-T' in out and '(1.00x)' in out


def test_missing_checkout_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='official checkout'):
        compare_official.main(['--mlla-root', str(tmp_path), '--sizes', '64'])


def test_needs_a_checkout():
    with pytest.raises(SystemExit):
        compare_official.main([])
