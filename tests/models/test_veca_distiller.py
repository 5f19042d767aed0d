"""VECADistiller: the official losses, a frozen teacher outside the optimizer, strict teacher
checkpoints, the checkpoint layout. Tiny student (VECA, width 32) and teacher (ViT, width 48)."""
import copy
import math
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.optim import build_optim_wrapper

import mmeffattn  # noqa: F401  (registers the models)
from mmeffattn.models.distill import (VECADistiller, global_cosine_loss, patch_losses,
                                      split_teacher_tokens)
from mmeffattn.registry import MODELS

STUDENT = dict(type='mmeffattn.VECA', arch=dict(embed_dims=32, depth=2, num_heads=2),
               out_proj_dims=48)
TEACHER = dict(type='mmpretrain.VisionTransformer',
               arch=dict(embed_dims=48, num_layers=2, num_heads=2, feedforward_channels=96),
               img_size=32, patch_size=16, out_type='raw')


def build(**kwargs) -> VECADistiller:
    cfg = dict(type='mmeffattn.VECADistiller', student=copy.deepcopy(STUDENT),
               teacher=copy.deepcopy(TEACHER), allow_random_teacher=True)
    cfg.update(kwargs)
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    return model


@pytest.fixture(scope='module')
def model() -> VECADistiller:
    return build()


def _images(b: int = 2, h: int = 40, w: int = 48) -> torch.Tensor:
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------- loss formulas
def test_loss_functions_on_hand_computed_vectors():
    # cos(s, t) per row: 1 (same direction), 0 (orthogonal), -1 (opposite) -> mean(1 - cos) = 1
    s = torch.tensor([[1., 0.], [1., 0.], [0., 2.]])
    t = torch.tensor([[3., 0.], [0., 5.], [0., -1.]])
    assert global_cosine_loss(s, t).item() == pytest.approx((0 + 1 + 2) / 3)
    # patches [1, 2, 2]: cos distances 0 and 1; squared errors (1, 0, 1, 1) / 4
    sp = torch.tensor([[[1., 0.], [0., 1.]]])
    tp = torch.tensor([[[2., 0.], [1., 0.]]])
    cos, mse = patch_losses(sp, tp)
    assert cos.item() == pytest.approx(0.5)
    assert mse.item() == pytest.approx(0.75)


def _reference_losses(s_glob, s_patch, t_cls, t_patch):
    """The official loss terms written out element by element, in float64."""
    s_glob, s_patch, t_cls, t_patch = (x.detach().double()
                                       for x in (s_glob, s_patch, t_cls, t_patch))
    B, N, D = s_patch.shape
    g = sum(1 - float(s_glob[b] @ t_cls[b]) / (float(s_glob[b].norm()) * float(t_cls[b].norm()))
            for b in range(B)) / B
    pc = sum(1 - float(s_patch[b, n] @ t_patch[b, n]) /
             (float(s_patch[b, n].norm()) * float(t_patch[b, n].norm()))
             for b in range(B) for n in range(N)) / (B * N)
    pm = float(((s_patch - t_patch) ** 2).sum()) / (B * N * D)
    return g, pc, pm


@pytest.mark.parametrize('weights', [None, dict(global_cos=2.0, patch_cos=0.5, patch_mse=3.0)],
                         ids=['official', 'weighted'])
def test_loss_equals_independent_formula(weights):
    model = build(loss_weights=weights)
    model.eval()  # a fixed core budget and no coordinate jitter: both passes see the same net
    x = _images()
    losses = model(x, mode='loss')
    assert set(losses) == {'loss_global_cos', 'loss_patch_cos', 'loss_patch_mse'}
    # the features straight from the two networks, not through the distiller
    s_glob, s_patch = model.student(x)
    t_tokens = model.teacher(x)[-1]  # [B, 1 + N, 48]: class token, then the patches
    assert s_patch.shape[1] == t_tokens.shape[1] - 1 == math.ceil(40 / 16) * math.ceil(48 / 16)
    g, pc, pm = _reference_losses(s_glob, s_patch, t_tokens[:, 0], t_tokens[:, 1:])
    w = {**dict(global_cos=1.0, patch_cos=1.0, patch_mse=1.0), **(weights or {})}
    assert losses['loss_global_cos'].item() == pytest.approx(w['global_cos'] * g, rel=1e-5)
    assert losses['loss_patch_cos'].item() == pytest.approx(w['patch_cos'] * pc, rel=1e-5)
    assert losses['loss_patch_mse'].item() == pytest.approx(w['patch_mse'] * pm, rel=1e-5)


def test_unknown_loss_weight_is_refused():
    with pytest.raises(ValueError, match='unknown loss_weights'):
        build(loss_weights=dict(cls=1.0))


# ----------------------------------------------------------------------------- the teacher
def test_teacher_frozen_hidden_and_in_eval(model):
    model.train()
    assert not model.teacher.training
    assert all(not p.requires_grad for p in model.teacher.parameters())
    teacher_ids = {id(p) for p in model.teacher.parameters()}
    assert teacher_ids and not teacher_ids & {id(p) for p in model.parameters()}
    # an optimizer built the mmengine way holds exactly the student's parameters
    wrapper = build_optim_wrapper(model, dict(optimizer=dict(type='AdamW', lr=1e-3)))
    in_opt = {id(p) for g in wrapper.optimizer.param_groups for p in g['params']}
    assert in_opt == {id(p) for p in model.student.parameters()}
    # someone switching the teacher to train mode is undone by the next forward
    model.teacher.train()
    model(_images(), mode='loss')
    assert not model.teacher.training


def test_gradients_reach_only_the_student():
    model = build()
    model.train()
    model.student.nested_dropout = False  # all 64 cores: every student parameter is used
    before = {k: v.clone() for k, v in model.teacher.state_dict().items()}
    wrapper = build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1)))
    student_before = model.student.norm1.weight.detach().clone()
    losses = model(_images(), mode='loss')
    wrapper.backward(sum(losses.values()))
    assert all(p.grad is None for p in model.teacher.parameters())
    no_grad = [n for n, p in model.student.named_parameters() if p.grad is None]
    assert not no_grad, no_grad
    wrapper.step()
    after = model.teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(model.student.norm1.weight, student_before)


def test_to_moves_the_teacher(model):
    m = copy.deepcopy(model).to(torch.float64)
    assert next(m.teacher.parameters()).dtype == torch.float64
    losses = m(_images().double(), mode='loss')
    assert all(torch.isfinite(v) for v in losses.values())


def test_random_teacher_refused_unless_allowed():
    model = MODELS.build(dict(type='mmeffattn.VECADistiller', student=STUDENT, teacher=TEACHER))
    with pytest.raises(RuntimeError, match='teacher_ckpt'):
        model.init_weights()


# ----------------------------------------------------------------------------- teacher ckpt
def test_teacher_checkpoint_loads_strictly(tmp_path, model):
    path = str(tmp_path / 'teacher.pth')
    torch.save({'state_dict': model.teacher.state_dict()}, path)
    other = build(teacher_ckpt=path, allow_random_teacher=False)
    for k, v in model.teacher.state_dict().items():
        assert torch.equal(other.teacher.state_dict()[k], v), k
    # inside a whole-model checkpoint: selected by prefix; without it the error names the prefix
    whole = str(tmp_path / 'whole.pth')
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in model.teacher.state_dict().items()}},
               whole)
    with pytest.raises(RuntimeError, match=r"teacher_ckpt_prefix='backbone\.'"):
        build(teacher_ckpt=whole)
    again = build(teacher_ckpt=whole, teacher_ckpt_prefix='backbone.')
    assert torch.equal(again.teacher.ln1.weight, model.teacher.ln1.weight)


def test_teacher_checkpoint_mismatch_errors(tmp_path, model):
    sd = model.teacher.state_dict()
    missing = {k: v for k, v in sd.items() if k != 'ln1.weight'}
    torch.save(missing, str(tmp_path / 'missing.pth'))
    with pytest.raises(RuntimeError, match=r"1 missing keys \['ln1.weight'\]"):
        build(teacher_ckpt=str(tmp_path / 'missing.pth'))
    extra = dict(sd, **{'head.fc.weight': torch.zeros(3, 48)})
    torch.save(extra, str(tmp_path / 'extra.pth'))
    with pytest.raises(RuntimeError, match=r"1 unexpected keys \['head.fc.weight'\]"):
        build(teacher_ckpt=str(tmp_path / 'extra.pth'))
    wrong = dict(sd, **{'ln1.weight': torch.ones(64)})
    torch.save(wrong, str(tmp_path / 'wrong.pth'))
    with pytest.raises(RuntimeError, match='size mismatch for ln1.weight'):
        build(teacher_ckpt=str(tmp_path / 'wrong.pth'))
    with pytest.raises(RuntimeError, match="no key .* starts with prefix 'neck.'"):
        build(teacher_ckpt=str(tmp_path / 'wrong.pth'), teacher_ckpt_prefix='neck')


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoint_holds_student_only_unless_save_teacher(tmp_path, model):
    from mmengine.runner.checkpoint import get_state_dict, load_checkpoint, save_checkpoint
    keys = list(get_state_dict(model))
    assert keys and all(k.startswith(('student.', 'data_preprocessor.')) for k in keys)
    assert list(model.state_dict()) == keys

    saver = build(save_teacher=True)
    with torch.no_grad():
        saver.teacher.ln1.weight.fill_(0.5)  # a teacher no fresh build reproduces
    sd = get_state_dict(saver)
    assert 'teacher.ln1.weight' in sd and 'student.norm1.weight' in sd
    path = str(tmp_path / 'with_teacher.pth')
    save_checkpoint({'state_dict': sd}, path)
    fresh = build(save_teacher=True)
    # mmengine's loader (resume, load_from) and torch's strict load both restore the teacher
    load_checkpoint(fresh, path, map_location='cpu', strict=True)
    assert torch.equal(fresh.teacher.ln1.weight, saver.teacher.ln1.weight)
    plain = build()
    plain.load_state_dict(saver.state_dict(), strict=True)
    assert torch.equal(plain.teacher.ln1.weight, saver.teacher.ln1.weight)


# ----------------------------------------------------------------------------- wiring
def test_teacher_token_layouts():
    tokens = torch.arange(2 * 9 * 3, dtype=torch.float32).reshape(2, 9, 3)
    cls_tok, patches = split_teacher_tokens((tokens, ), num_extra_tokens=1, num_register_tokens=4)
    assert torch.equal(cls_tok, tokens[:, 0]) and torch.equal(patches, tokens[:, 5:])
    pair = (tokens[:, 0], tokens[:, 1:])
    out = split_teacher_tokens(pair)
    assert out[0] is pair[0] and out[1] is pair[1]
    with pytest.raises(ValueError, match='no class token'):
        split_teacher_tokens(tokens, num_extra_tokens=0)
    with pytest.raises(ValueError, match="out_type='raw'"):
        split_teacher_tokens((tokens[:, 0], ))


def test_mismatches_are_explained():
    with pytest.raises(ValueError, match='out_proj_dims=48'):
        build(student=dict(STUDENT, out_proj_dims=None))
    with pytest.raises(ValueError, match="out_type='raw'"):
        build(student=dict(STUDENT, out_type='global'))
    model = build(teacher=dict(TEACHER, patch_size=8))
    with pytest.raises(ValueError, match='patch tokens'):
        model(_images(), mode='loss')
    with pytest.raises(RuntimeError, match='invalid mode'):
        model(_images(), mode='features')


def test_tensor_and_predict_modes(model):
    model.eval()
    x = _images(b=3, h=32, w=32)
    glob, patches = model(x, mode='tensor')
    assert glob.shape == (3, 48) and patches.shape == (3, 4, 48)
    with torch.no_grad():
        preds = model(x, mode='predict')
    assert len(preds) == 3
    ref = torch.cosine_similarity(glob[1], model.teacher(x)[-1][1, 0], dim=0)
    assert preds[1].global_cos.item() == pytest.approx(ref.item(), rel=1e-5)
    assert preds[1].patch_feat.shape == (4, 48) and -1 <= preds[1].patch_cos.item() <= 1


def test_student_patch_projection_copied_when_shapes_match():
    student = dict(STUDENT, arch=dict(embed_dims=48, depth=2, num_heads=2), out_proj_dims=None)
    model = build(student=student,
                  init_student_patch_embed=('patch_embed.projection', 'patch_embed.proj'))
    assert torch.equal(model.student.patch_embed.proj.weight,
                       model.teacher.patch_embed.projection.weight)
    with pytest.raises(ValueError, match="no module 'patch_embed.conv'"):
        build(student=student, init_student_patch_embed=('patch_embed.projection',
                                                         'patch_embed.conv'))


def _random_teacher_worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    torch.manual_seed(rank)  # as diff_rank_seed: each rank builds a different random teacher
    model = MODELS.build(dict(type='mmeffattn.VECADistiller', student=STUDENT, teacher=TEACHER,
                              allow_random_teacher=True))
    built = model.teacher.ln1.weight.clone() + model.teacher.layers[0].attn.qkv.weight.sum()
    model.init_weights()
    torch.save(dict(built=built, teacher=model.teacher.state_dict()), f'{out}.{rank}')
    dist.destroy_process_group()


@pytest.mark.slow  # two fresh interpreters importing the stack: ~30 s on 2 busy cores
def test_random_teacher_is_the_same_on_every_rank(tmp_path):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    out = str(tmp_path / 'teacher')
    # spawn, not fork: a fork after torch's thread pools have run can deadlock the children
    mp.spawn(_random_teacher_worker, args=(port, out), nprocs=2)
    r0, r1 = (torch.load(f'{out}.{r}', weights_only=True) for r in (0, 1))
    assert not torch.equal(r0['built'], r1['built'])  # the ranks did start apart
    for k, v in r0['teacher'].items():
        assert torch.equal(v, r1['teacher'][k]), k
