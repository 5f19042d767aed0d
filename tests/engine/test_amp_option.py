"""``--amp`` on the CPU: bf16 autocast, refused before anything is built for models whose training
runs mmcv's NMS (its CPU kernel takes fp32 boxes only: Mask R-CNN stopped in its first
iteration with "expected scalar type Float but found BFloat16")."""
import pytest
import torch
from mmengine.config import Config

from mmeffattn.engine.runner_setup import _training_nms_key, enable_amp


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)


def test_mask_rcnn_is_refused_naming_the_nms_key():
    cfg = Config.fromfile('configs/mask_rcnn_sema_t_3x.py')
    with pytest.raises(ValueError, match=r"--amp on the CPU .*mmcv's NMS while training "
                                         r'\(model\.train_cfg\.rpn_proposal\.nms\).*without --amp'):
        enable_amp(cfg)
    assert cfg.optim_wrapper.get('type', 'OptimWrapper') == 'OptimWrapper'


@pytest.mark.parametrize('config', ['configs/sema/retinanet_sema-t_fpn_1x_coco.py',
                                    'configs/sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py'],
                         ids=['retinanet', 'upernet'])
def test_models_without_training_nms_get_cpu_autocast(config):
    cfg = Config.fromfile(config)
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == 'mmeffattn.CPUAutocastOptimWrapper'


def test_nms_key_search():
    assert _training_nms_key(None, 'model.train_cfg') is None
    assert _training_nms_key(dict(rpn=dict(nms=None)), 'm') is None  # switched off: no NMS
    assert _training_nms_key(dict(rcnn=[dict(x=1), dict(nms=dict(iou_threshold=0.7))]),
                             'm') == 'm.rcnn[1].nms'
