"""The main job's pipeline, end to end at a tiny size: data generation, train, test, pictures."""
import json
import os.path as osp

import pytest
from e2e_helpers import run_tool

pytestmark = pytest.mark.e2e


def test_demo_smoke(tmp_path):
    work, data = tmp_path / 'work', tmp_path / 'shapes'
    proc = run_tool(['tools/demo.py', '--work-dir', str(work), '--data-root', str(data),
                     '--epochs', '1', '--num-train', '8', '--num-val', '4', '--num-draw', '2'],
                    timeout=900)
    out = proc.stdout
    metrics = json.load(open(work / 'metrics.json'))['metrics']
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert 0.0 <= metrics[key] <= 1.0
    assert (work / 'epoch_1.pth').is_file()
    pics = sorted((work / 'predictions').glob('*.png'))
    assert len(pics) == 2
    # the summary names every artifact, and they exist
    for line in ('checkpoint:', 'training log:', 'metrics JSON:', 'predictions drawn:'):
        assert line in out, out[-3000:]
    log = out.split('training log: ')[1].split()[0]
    assert osp.isfile(log)
