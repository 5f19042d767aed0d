"""get_flops.py counts a whole detector/segmentor (backbone, neck, heads) beside its backbone.

Published Mask R-CNN 1x figures at 1280x800: MLLA-T 44 M / 255 G (MLLA README), Swin-T 48 M /
267 G (Swin README). Parameters do not depend on the input size, so the default test checks them
at a small size; the FLOPs at the full size (minutes of CPU each) run under --run-slow."""
import os.path as osp
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis_tools'))
from get_flops import PAPER_SHAPES, count, main  # noqa: E402

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


def test_paper_shapes():
    assert PAPER_SHAPES['detector'] == (800, 1280) and PAPER_SHAPES['segmentor'] == (512, 2048)


@pytest.mark.slow
@pytest.mark.parametrize('config', [MILA, SWIN], ids=['mila-t', 'swin-t'])
def test_mask_rcnn_1x_matches_published(config):
    r = count(config)  # the paper's size: 800x1280
    assert r['shape'] == (800, 1280) and r['model']['what'] == 'whole detector'
    params, flops = PUBLISHED[config]
    assert r['model']['params'] == pytest.approx(params, rel=0.05)
    assert r['model']['flops'] == pytest.approx(flops, rel=0.05)
