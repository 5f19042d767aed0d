"""Model size and cost match the published figures (MLLA README: MILA-T 25M, 4.2G at 224)."""
import os.path as osp
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis_tools'))
from get_flops import count  # noqa: E402


def test_mila_t_matches_published():
    r = count(osp.join(ROOT, 'configs/mila/mila-t_8xb128_in1k.py'), (224, 224))
    assert r['what'] == 'classifier'
    # The official MLLA-T classifier has exactly 24,392,200 parameters (README rounds to 25M).
    assert r['params'] == 24_392_200
    assert r['flops'] == pytest.approx(4.2e9, rel=0.05)


def test_sema_t_adds_value_projection_and_window_attention():
    mila = count(osp.join(ROOT, 'configs/mila/mila-t_8xb128_in1k.py'), (224, 224))
    sema = count(osp.join(ROOT, 'configs/sema/sema-t_8xb128_in1k.py'), (224, 224))
    # one dim x dim value projection (+ bias) per block: depths 2-4-8-4 at 64-128-256-512
    v_proj = sum(d * (c * c + c) for d, c in zip((2, 4, 8, 4), (64, 128, 256, 512)))
    assert sema['params'] - mila['params'] == v_proj
    assert sema['params'] == pytest.approx(26e6, rel=0.03)  # "about 26M" (SEMA paper)
    assert sema['flops'] > mila['flops']


def test_backbone_only_for_detectors():
    r = count(osp.join(ROOT, 'configs/mask_rcnn_sema_t_3x.py'), (64, 96))
    assert r['what'] == 'backbone' and r['flops'] > 0
