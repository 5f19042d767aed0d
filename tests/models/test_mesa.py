"""MLLA's MESA term (MESAClassifier + MESAHook) and the EMA in the ImageNet recipes."""
import os.path as osp
import types

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope

import mmeffattn  # noqa: F401
from mmeffattn.engine import MESAHook
from mmeffattn.models.distill import soft_target_cross_entropy
from mmeffattn.registry import MODELS

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    # the PyTorch references: the loss term is the subject, not the (interpreted) kernels
    monkeypatch.setenv('MMEFFATTN_OPS_BACKEND', 'reference')


def tiny_classifier(type_: str = 'mmeffattn.MESAClassifier', classes: int = 5):
    from mmpretrain.structures import DataSample  # noqa: F401 (registers mmpretrain's scope)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(dict(
            type=type_,
            backbone=dict(type='mmeffattn.SEMA', arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                          num_heads=[1, 1, 1, 1]), out_indices=(3, ), drop_path_rate=0.),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(type='LinearClsHead', num_classes=classes, in_channels=128,
                      loss=dict(type='CrossEntropyLoss', loss_weight=1.0))))


def samples(n: int, classes: int = 5):
    from mmpretrain.structures import DataSample
    return [DataSample().set_gt_label(i % classes) for i in range(n)]


def test_soft_target_cross_entropy_is_timms():
    logits, t = torch.randn(3, 5), torch.randn(3, 5).softmax(-1)
    want = -(t * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(soft_target_cross_entropy(logits, t), want)
    # a one-hot target is ordinary cross-entropy
    y = torch.tensor([0, 3, 1])
    torch.testing.assert_close(soft_target_cross_entropy(logits, F.one_hot(y, 5).float()),
                               F.cross_entropy(logits, y))


def test_mesa_term_uses_the_teachers_softmax_and_no_teacher_gradient():
    torch.manual_seed(0)
    student, teacher = tiny_classifier(), tiny_classifier()
    x, ds = torch.randn(2, 3, 32, 32), samples(2)
    plain = student.loss(x, ds)
    assert set(plain) == {'loss'}
    student.set_mesa_teacher(teacher.eval(), 1.5)
    losses = student.loss(x, ds)
    torch.testing.assert_close(losses['loss'], plain['loss'])
    logits = student(x, mode='tensor')
    with torch.no_grad():
        target = teacher(x, mode='tensor').softmax(-1)
    torch.testing.assert_close(losses['loss_mesa'], 1.5 * soft_target_cross_entropy(logits, target))
    (losses['loss'] + losses['loss_mesa']).backward()
    assert all(p.grad is None for p in teacher.parameters())
    # the teacher is not part of the student: no keys, no parameters
    assert set(student.state_dict()) == set(teacher.state_dict())
    assert len(list(student.parameters())) == len(list(teacher.parameters()))
    student.set_mesa_teacher(None)
    assert set(student.loss(x, ds)) == {'loss'}


def _runner(model, epoch: int, max_epochs: int):
    from mmengine.runner import EpochBasedTrainLoop
    loop = object.__new__(EpochBasedTrainLoop)
    return types.SimpleNamespace(model=model, epoch=epoch, max_epochs=max_epochs,
                                 train_loop=loop)


@pytest.mark.parametrize('epoch, on', [(0, False), (74, False), (75, True), (299, True)])
def test_hook_turns_the_term_on_after_a_quarter_of_the_epochs(epoch, on):
    model = tiny_classifier()
    hook = MESAHook(momentum=1e-4, mesa_weight=1.0)
    runner = _runner(model, epoch, 300)
    hook.before_run(runner)
    model.train()
    hook.before_train_iter(runner, 0)
    mesa = model.__dict__.get('_mesa')
    assert (mesa is not None) is on
    if on:
        teacher, weight = mesa
        assert teacher is hook.ema_model.module and not teacher.training and weight == 1.0
    hook.after_train(runner)
    assert model.__dict__.get('_mesa') is None


def test_hook_needs_the_mesa_classifier():
    model = tiny_classifier('ImageClassifier')
    with pytest.raises(TypeError, match=r"model.type='mmeffattn.MESAClassifier'.*EMAHook"):
        MESAHook().before_run(_runner(model, 0, 10))


@pytest.mark.parametrize('kwargs, match', [(dict(mesa_weight=-1), 'mesa_weight'),
                                           (dict(start_ratio=1.5), 'start_ratio')])
def test_hook_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MESAHook(**kwargs)


@pytest.mark.parametrize('path, hook, momentum', [
    ('configs/sema/sema-t_8xb128_in1k.py', 'MESAHook', 1e-4),
    ('configs/mila/mila-t_8xb128_in1k.py', 'MESAHook', 1e-4),
    ('configs/laplacianformer/laplacianformer-s_8xb128_in1k.py', 'EMAHook', 4e-5),
])
def test_imagenet_recipes_keep_an_ema(path, hook, momentum):
    """MLLA: decay 0.9996 ** (1024 / 4096) per step at batch 1024 (momentum 1e-4) and MESA 1.0
    for T from a quarter of the epochs; SOFT: decay 0.99996 per step."""
    cfg = Config.fromfile(osp.join(ROOT, path))
    h, = [h for h in cfg.custom_hooks if h.type == hook]
    assert h.momentum == momentum and h.update_buffers
    if hook == 'MESAHook':
        assert abs((1 - 0.9996 ** (1024 / 4096)) - momentum) < 1e-6
        assert cfg.model.type == 'mmeffattn.MESAClassifier'
        assert (h.mesa_weight, h.start_ratio) == (1.0, 0.25)
