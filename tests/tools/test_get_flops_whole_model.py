"""get_flops.py counts a whole detector/segmentor (backbone, neck, heads) beside its backbone.

Published Mask R-CNN 1x figures at 1280x800: MLLA-T 44 M / 255 G (MLLA README), Swin-T 48 M /
267 G (Swin README). Parameters do not depend on the input size, so the default test checks them
at a small size; the FLOPs at the full size (minutes of CPU each) run under --run-slow."""
import os.path as osp

import pytest

from tools.analysis_tools.get_flops import count, main

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

MILA = osp.join(ROOT, 'configs/mila/mask-rcnn_mila-t_fpn_1x_coco.py')
SWIN = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
PUBLISHED = {MILA: (44e6, 255e9), SWIN: (48e6, 267e9)}


def test_whole_detector_beside_backbone_at_a_small_size(capsys):
    main([MILA, '--shape', '128', '192'])
    out = capsys.readouterr().out
    whole, backbone = out.splitlines()[0], [ln for ln in out.splitlines()
                                           if 'backbone at 128x192' in ln][0]
    assert 'whole detector at 128x192' in whole
    params = [float(ln.split(': ')[-1].split(' M ')[0]) for ln in (whole, backbone)]
    flops = [float(ln.split('parameters, ')[1].split(' GFLOPs')[0]) for ln in (whole, backbone)]
    assert params[0] == pytest.approx(PUBLISHED[MILA][0] / 1e6, rel=0.05)
    assert params[0] > params[1] and flops[0] > flops[1] > 0


def test_default_size_is_the_papers(monkeypatch):
    """Without a shape a detector is counted at the paper's 800x1280, the backbone and the whole
    model alike (the counts themselves are stubbed: at that size they take minutes)."""
    from mmeffattn.analysis import flops
    seen = []

    def fake_count(model, inputs):
        seen.append(tuple(inputs[0].shape))
        return flops.FlopCount(total=1, by_operator={})

    monkeypatch.setattr(flops, 'count_flops', fake_count)
    r = count(MILA)
    assert r['shape'] == (800, 1280) and r['model']['what'] == 'whole detector'
    assert seen == [(1, 3, 800, 1280)] * 2


@pytest.mark.slow
@pytest.mark.parametrize('config', [MILA, SWIN], ids=['mila-t', 'swin-t'])
def test_mask_rcnn_1x_matches_published(config):
    r = count(config)  # the paper's size: 800x1280
    assert r['shape'] == (800, 1280) and r['model']['what'] == 'whole detector'
    params, flops = PUBLISHED[config]
    assert r['model']['params'] == pytest.approx(params, rel=0.05)
    assert r['model']['flops'] == pytest.approx(flops, rel=0.05)
