"""The attention zoo in the benchmark tools: model_zoo's 'zoo' group, benchmark.py's 'zoo'
preset and tools/analysis_tools/zoo_table.py on tiny sizes."""
import json
import os.path as osp

import pytest
import torch

from mmeffattn.analysis import model_zoo

from tools import benchmark
from tools.analysis_tools import zoo_table


def test_zoo_group_names_every_mixer_and_stays_out_of_all():
    from mmeffattn.models.backbones.attention_zoo import mixer_names
    assert {model_zoo.get_model(n).attention for n in model_zoo.ZOO} == set(mixer_names())
    assert set(zoo_table.DISPERSION_KIND) == set(mixer_names())
    assert model_zoo.select_models(['zoo']) == model_zoo.ZOO
    assert not set(model_zoo.ZOO) & set(model_zoo.select_models(['all']))
    assert model_zoo.select_models(['Zoo-window']) == ['Zoo-window']
    with pytest.raises(ValueError, match="'zoo'"):
        model_zoo.select_models(['Zoo-flash'])
    for name in model_zoo.ZOO:
        entry = model_zoo.get_model(name)
        assert model_zoo.unavailable_reason(name) is None
        assert osp.isfile(model_zoo.resolve_config(entry.classifier)), entry.classifier
    with torch.device('meta'):
        assert model_zoo.build_backbone('Zoo-dynamic').attn_type == 'dynamic'


def test_zoo_preset():
    args = benchmark.parse_args(['--preset', 'zoo'])
    assert args.models == ['zoo'] and args.reference == 'Zoo-sema' and args.threads == 1
    assert args.sizes == ['224', '512', '1024']
    assert benchmark.parse_args([]).reference == 'Swin-T'  # other presets keep their default


def test_zoo_table_smoke(tmp_path, monkeypatch):
    import dataclasses
    mini = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
    for name in ('Zoo-sema', 'Zoo-dynamic', 'Zoo-core_periphery'):  # the plumbing, small
        entry = model_zoo.ATTENTION_ZOO[name]
        monkeypatch.setitem(model_zoo.ATTENTION_ZOO, name, dataclasses.replace(
            entry, backbone=dict(entry.backbone, arch=mini)))
    threads = torch.get_num_threads()
    try:
        report = zoo_table.main(['--sizes', '32', '--models', 'Zoo-sema', 'Zoo-dynamic',
                                 'Zoo-core_periphery', '--out-dir', str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the preset runs on one thread
    saved = json.loads((tmp_path / 'zoo.json').read_text())
    assert [r['status'] for r in saved['benchmark']['results']] == ['ok'] * 3
    assert report['dispersion']['Zoo-dynamic'] == []
    for name in ('Zoo-sema', 'Zoo-core_periphery'):
        (row, ) = report['dispersion'][name]
        assert 0 < row['normalized_entropy'] <= 1 + 1e-6 and row['effective_keys'] >= 1
    md = (tmp_path / 'zoo.md').read_text()
    assert '| dynamic | n/a (no attention weights) |' in md
    assert '| sema | sema |' in md and '| core_periphery | core_periphery |' in md
