"""VECA pretraining by feature distillation from a frozen ViT teacher (the official recipe): the
student's global core and patch tokens learn the teacher's CLS and patch features (cosine and
MSE losses). Details: docs/design/veca.md.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dist import broadcast
from mmengine.logging import MMLogger
from mmengine.model import BaseModel
from mmengine.structures import BaseDataElement

from mmeffattn.registry import MODELS
from ..utils import load_state_dict_strict, read_checkpoint
from ..utils.pretrained import guess_prefix

__all__ = ['VECADistiller', 'split_teacher_tokens', 'global_cosine_loss', 'patch_losses',
           'load_teacher_checkpoint']

Tokens = Tuple[torch.Tensor, torch.Tensor]  # (global/class [B, D], patches [B, N, D])
DEFAULT_PREPROCESSOR = dict(
    type='mmpretrain.SelfSupDataPreprocessor',
    # the official normalisation (veca/data.py: ImageNet mean/std on [0, 1] RGB) on 0..255 BGR
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)


def global_cosine_loss(student: torch.Tensor, teacher: torch.Tensor,
                       eps: float = 1e-6) -> torch.Tensor:
    """``mean_b(1 - <s/|s|, t/|t|>)`` in fp32 for ``student``/``teacher`` of shape ``[B, D]``."""
    s = F.normalize(student.float(), dim=-1, eps=eps)
    t = F.normalize(teacher.float(), dim=-1, eps=eps)
    return (1.0 - (s * t).sum(-1)).mean()


def patch_losses(student: torch.Tensor, teacher: torch.Tensor,
                 eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token cosine distance and MSE, each averaged, in fp32. Shapes ``[B, N, D]``."""
    s, t = student.float(), teacher.float()
    cos = (1.0 - F.cosine_similarity(s, t, dim=-1, eps=eps)).mean()
    return cos, F.mse_loss(s, t)


def split_teacher_tokens(outs: Union[torch.Tensor, Sequence[torch.Tensor]],
                         num_extra_tokens: int = 1,
                         num_register_tokens: int = 0) -> Tokens:
    """``(class token [B, D], patch tokens [B, N, D])`` from a teacher's output: a sequence
    ``[B, T, D]`` (class token and other extra tokens, registers, patches; alone or last in a
    tuple) or a pair ``([B, D], [B, N, D])``."""
    if isinstance(outs, (tuple, list)):
        if len(outs) == 2 and outs[0].dim() == 2 and outs[1].dim() == 3:
            return outs[0], outs[1]
        if len(outs) == 0:
            raise ValueError('the teacher returned an empty tuple; give it out_indices=-1')
        outs = outs[-1]
    if not torch.is_tensor(outs) or outs.dim() != 3:
        shape = tuple(outs.shape) if torch.is_tensor(outs) else type(outs).__name__
        raise ValueError(
            f'cannot read class and patch tokens from a teacher output of shape {shape}: build '
            f"the teacher to return all tokens [B, T, D] (mmpretrain VisionTransformer: "
            f"out_type='raw') or a pair (class [B, D], patches [B, N, D])")
    if num_extra_tokens < 1:
        raise ValueError('the teacher has no class token (num_extra_tokens=0), but the global '
                         'core is distilled from it: build it with with_cls_token=True')
    start = num_extra_tokens + num_register_tokens
    if outs.shape[1] <= start:
        raise ValueError(f'teacher output has {outs.shape[1]} tokens, not more than the '
                         f'{num_extra_tokens} extra + {num_register_tokens} register tokens')
    return outs[:, 0], outs[:, start:]


def load_teacher_checkpoint(teacher: nn.Module, checkpoint: str, prefix: Optional[str] = None,
                            map_location: str = 'cpu') -> None:
    """Load ``checkpoint`` (under ``prefix``) into ``teacher`` strictly; a mismatch raises
    naming the keys."""
    state_dict = read_checkpoint(checkpoint, prefix, map_location, what='teacher checkpoint',
                                 prefix_option='teacher_ckpt_prefix')

    def hint(missing: List[str], unexpected: List[str], mismatched: List[str]) -> str:
        found = guess_prefix(next(iter(teacher.state_dict()), None), unexpected)
        if found:
            return (f'Hint: the teacher weights seem to lie under {found!r}: set '
                    f'teacher_ckpt_prefix={found!r}.')
        return ('Hint: check that the teacher config (arch, patch size, class/register tokens, '
                'layer scale, final norm) matches the checkpoint, and convert a checkpoint in '
                "another library's layout to the teacher's first.")

    # shapes are left to the teacher's load_state_dict: its hooks may resize position embeddings
    load_state_dict_strict(teacher, state_dict, f'teacher checkpoint {checkpoint!r}',
                           describe=f'the teacher {type(teacher).__name__}', check_shapes=False,
                           hint=hint)


def _feature_dims(module: nn.Module, role: str) -> int:
    proj = getattr(module, 'output_proj', None)
    if isinstance(proj, nn.Linear):  # VECA with out_proj_dims
        return proj.out_features
    for name in ('embed_dims', 'embed_dim', 'hidden_size', 'num_features'):
        dims = getattr(module, name, None)
        if isinstance(dims, int):
            return dims
    raise ValueError(f'cannot tell the feature width of the {role} {type(module).__name__} (no '
                     f'embed_dims attribute)')


@MODELS.register_module()
class VECADistiller(BaseModel):
    """Distils a frozen teacher's class and patch features into a VECA student.

    Args:
        student: backbone config, ``out_type='raw'`` at the teacher width (``out_proj_dims``).
        teacher: backbone config of the frozen teacher (``out_type='raw'``, e.g. mmpretrain's ViT).
        teacher_ckpt, teacher_ckpt_prefix: the teacher's checkpoint (loaded strictly at build)
            and its key prefix there.
        allow_random_teacher: train without ``teacher_ckpt`` (tests, smoke runs).
        teacher_num_register_tokens: registers after the class token (DINOv3: 4).
        init_student_patch_embed: ``(teacher_module, student_module)`` names: copy the teacher's
            patch projection into the student when shapes match.
        loss_weights: ``dict(global_cos=, patch_cos=, patch_mse=)``; norm_eps: the cosines' eps.
        save_teacher: also write the teacher into checkpoints (``teacher.*``).
        data_preprocessor: default ``SelfSupDataPreprocessor`` (official mean/std, BGR->RGB).
        init_cfg: the distiller's (the student has its own).
    """

    LOSS_KEYS = ('global_cos', 'patch_cos', 'patch_mse')

    def __init__(self,
                 student: dict,
                 teacher: dict,
                 teacher_ckpt: Optional[str] = None,
                 teacher_ckpt_prefix: Optional[str] = None,
                 allow_random_teacher: bool = False,
                 teacher_num_register_tokens: int = 0,
                 init_student_patch_embed: Optional[Sequence[str]] = None,
                 loss_weights: Optional[Dict[str, float]] = None,
                 norm_eps: float = 1e-6,
                 save_teacher: bool = False,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor or dict(DEFAULT_PREPROCESSOR),
                         init_cfg=init_cfg)
        student = dict(student)
        if student.setdefault('out_type', 'raw') != 'raw':
            raise ValueError(f"the student must return its raw tokens: set out_type='raw' in "
                             f"the student config (got {student['out_type']!r})")
        weights = dict(global_cos=1.0, patch_cos=1.0, patch_mse=1.0)
        weights.update(loss_weights or {})
        unknown = sorted(set(weights) - set(self.LOSS_KEYS))
        if unknown:
            raise ValueError(f'unknown loss_weights keys {unknown}; use {list(self.LOSS_KEYS)}')
        if teacher_num_register_tokens < 0:
            raise ValueError('teacher_num_register_tokens must be >= 0')
        self.loss_weights = weights
        self.norm_eps = float(norm_eps)
        self.teacher_ckpt = teacher_ckpt
        self.allow_random_teacher = allow_random_teacher
        self.teacher_num_register_tokens = int(teacher_num_register_tokens)
        self.save_teacher = save_teacher
        if init_student_patch_embed is not None and len(init_student_patch_embed) != 2:
            raise ValueError('init_student_patch_embed must be (teacher_module, student_module) '
                             f'names, got {init_student_patch_embed!r}')
        self.init_student_patch_embed = init_student_patch_embed

        self.student = MODELS.build(student)
        teacher_module = MODELS.build(teacher)
        if teacher_ckpt is not None:
            load_teacher_checkpoint(teacher_module, teacher_ckpt, prefix=teacher_ckpt_prefix)
            MMLogger.get_current_instance().info(f'VECADistiller: teacher loaded from '
                                                 f'{teacher_ckpt!r}')
        elif hasattr(teacher_module, 'init_weights'):  # (not a child: the runner misses it)
            teacher_module.init_weights()
        teacher_module.eval()
        teacher_module.requires_grad_(False)
        # a tuple hides it from nn.Module's registration (docs/design/veca.md)
        self._teacher = (teacher_module, )

        s_dims = _feature_dims(self.student, 'student')
        t_dims = _feature_dims(teacher_module, 'teacher')
        if s_dims != t_dims:
            raise ValueError(
                f'the student outputs {s_dims} channels but the teacher {t_dims}: add '
                f'out_proj_dims={t_dims} to the student config (the official output projection)')
        self._register_state_dict_hook(VECADistiller._add_teacher_state)
        self._register_load_state_dict_pre_hook(self._take_teacher_state)

    @property
    def teacher(self) -> nn.Module:
        return self._teacher[0]

    def _apply(self, fn, *args, **kwargs):
        # to(), cuda(), float(), ... reach the teacher too
        super()._apply(fn, *args, **kwargs)
        self.teacher._apply(fn, *args, **kwargs)
        return self

    @staticmethod
    def _add_teacher_state(module: 'VECADistiller', state_dict: dict, prefix: str,
                           local_metadata: dict) -> None:
        if module.save_teacher:
            for k, v in module.teacher.state_dict().items():
                state_dict[f'{prefix}teacher.{k}'] = v

    def _take_teacher_state(self, state_dict: dict, prefix: str, *args) -> None:
        # teacher.* keys (save_teacher=True) load into the teacher, never into the student
        head = f'{prefix}teacher.'
        keys = [k for k in state_dict if k.startswith(head)]
        if keys:
            self.teacher.load_state_dict({k[len(head):]: state_dict.pop(k) for k in keys},
                                         strict=True)

    def init_weights(self) -> None:
        """Initialise the student (and copy the teacher's patch projection when asked);
        refuses to start training from a random teacher unless allowed."""
        if self.teacher_ckpt is None and not self.allow_random_teacher:
            raise RuntimeError(
                'VECADistiller: model.teacher_ckpt is None, so the teacher is random and the '
                'student would learn nothing. Set model.teacher_ckpt=PATH to the teacher '
                "weights in the teacher config's layout (see the config's comment), or "
                'model.allow_random_teacher=True for a smoke test.')
        if self.teacher_ckpt is None:
            # under diff_rank_seed a random teacher differs per rank: use rank 0's everywhere
            for tensor in self.teacher.state_dict().values():
                broadcast(tensor, src=0)
        super().init_weights()
        if self.init_student_patch_embed is not None:
            self._copy_patch_embed(*self.init_student_patch_embed)

    @torch.no_grad()
    def _copy_patch_embed(self, teacher_name: str, student_name: str) -> None:
        src = dict(self.teacher.named_modules()).get(teacher_name)
        dst = dict(self.student.named_modules()).get(student_name)
        if src is None or dst is None:
            missing = teacher_name if src is None else student_name
            raise ValueError(f'init_student_patch_embed: no module {missing!r} in the '
                             f'{"teacher" if src is None else "student"}')
        logger = MMLogger.get_current_instance()
        if src.weight.shape != dst.weight.shape:
            logger.info(f'VECADistiller: patch projection not copied from the teacher: shapes '
                        f'{tuple(src.weight.shape)} vs {tuple(dst.weight.shape)}')
            return
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            dst.bias.copy_(src.bias if src.bias is not None else torch.zeros_like(dst.bias))
        logger.info(f'VECADistiller: student {student_name} starts from the teacher\'s '
                    f'{teacher_name}')

    def extract_student(self, inputs: torch.Tensor) -> Tokens:
        """Student tokens at the teacher width: ``[B, Dt]``, ``[B, N, Dt]``."""
        outs = self.student(inputs)
        if not (isinstance(outs, (tuple, list)) and len(outs) == 2):
            raise ValueError(f"the student must return (global, patches) (out_type='raw'), got "
                             f'{type(outs).__name__}')
        return outs[0], outs[1]

    @torch.no_grad()
    def extract_teacher(self, inputs: torch.Tensor) -> Tokens:
        """Teacher class and patch tokens ``[B, Dt]``, ``[B, N, Dt]``, without gradients."""
        teacher = self.teacher
        if teacher.training:  # someone called teacher.train(): it must stay deterministic
            teacher.eval()
        cls_tok, patches = split_teacher_tokens(
            teacher(inputs), getattr(teacher, 'num_extra_tokens', 1),
            self.teacher_num_register_tokens)
        return cls_tok.detach(), patches.detach()

    def _pair(self, inputs: torch.Tensor) -> Tuple[Tokens, Tokens]:
        if inputs.dim() != 4:
            raise ValueError(f'VECADistiller expects images [B, 3, H, W], got '
                             f'{tuple(inputs.shape)}')
        t_cls, t_patch = self.extract_teacher(inputs)
        s_glob, s_patch = self.extract_student(inputs)
        if s_patch.shape[1] != t_patch.shape[1]:
            raise ValueError(
                f'the student gives {s_patch.shape[1]} patch tokens but the teacher '
                f'{t_patch.shape[1]} for images of size {tuple(inputs.shape[-2:])}: give both the '
                f'same patch size (16) and check teacher_num_register_tokens '
                f'({self.teacher_num_register_tokens})')
        if s_glob.shape[-1] != t_cls.shape[-1]:
            raise ValueError(f'student width {s_glob.shape[-1]} != teacher width '
                             f'{t_cls.shape[-1]}: set the student out_proj_dims to the latter')
        return (s_glob, s_patch), (t_cls, t_patch)

    def loss(self, inputs: torch.Tensor) -> Dict[str, torch.Tensor]:
        (s_glob, s_patch), (t_cls, t_patch) = self._pair(inputs)
        w = self.loss_weights
        patch_cos, patch_mse = patch_losses(s_patch, t_patch, self.norm_eps)
        return dict(
            loss_global_cos=w['global_cos'] * global_cosine_loss(s_glob, t_cls, self.norm_eps),
            loss_patch_cos=w['patch_cos'] * patch_cos, loss_patch_mse=w['patch_mse'] * patch_mse)

    def predict(self, inputs: torch.Tensor,
                data_samples: Optional[List[BaseDataElement]] = None) -> List[BaseDataElement]:
        """Per image: student features and their cosine similarity to the teacher's
        (``global_cos`` a scalar, ``patch_cos`` the mean over patches), e.g. for validation."""
        (s_glob, s_patch), (t_cls, t_patch) = self._pair(inputs)
        g_cos = F.cosine_similarity(s_glob.float(), t_cls.float(), dim=-1, eps=self.norm_eps)
        p_cos = F.cosine_similarity(s_patch.float(), t_patch.float(), dim=-1,
                                    eps=self.norm_eps).mean(1)
        if data_samples is None:
            data_samples = [BaseDataElement() for _ in range(inputs.shape[0])]
        for i, sample in enumerate(data_samples):
            for name, value in (('global_feat', s_glob), ('patch_feat', s_patch),
                                ('global_cos', g_cos), ('patch_cos', p_cos)):
                sample.set_field(value[i], name)
        return data_samples

    def forward(self, inputs: torch.Tensor, data_samples: Optional[list] = None,
                mode: str = 'tensor'):
        """``mode='loss'``: the loss dict; ``'tensor'``: the student ``(global
        [B, Dt], patches [B, N, Dt])``; ``'predict'``: see :meth:`predict`."""
        if mode in ('loss', 'tensor'):
            return self.loss(inputs) if mode == 'loss' else self.extract_student(inputs)
        if mode == 'predict':
            return self.predict(inputs, data_samples)
        raise RuntimeError(f'invalid mode {mode!r}: use "loss", "tensor" or "predict"')
