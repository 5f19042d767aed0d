# VECA-S pretraining by feature distillation from a frozen ViT-B/16 teacher on unlabeled images.
# The teacher only approximates the paper's DINOv3 ViT-B/16 (hence "approx-dinov3" in the name):
# mmpretrain's VisionTransformer has no RoPE and no register tokens, so DINOv3's weights do not
# load into it as they are and its features differ from DINOv3's (details at `teacher` below).
# The official recipe (github.com/alansong1322/VECA: veca/config.py PretrainConfig,
# veca/train_pretrain.py, veca/data.py): 256 px crops, batch 6 GPUs x 128, 135 epochs with 25
# warm-up epochs (linear from lr_min to lr), then cosine to lr_min = 5e-5, lr 4e-4, weight decay
# 0.015, nested core budgets 8..64 (weights 1,1,2,2,3,3,4,4; the student's nested_dropout), loss
# = cos(global, cls) + cos(patches) + 1.0 * mse(patches), bf16 autocast.
# What differs here:
# - optimizer: AdamW for every parameter (the official run puts the 2-D linear weights under
#   NorMuon from the `dion` package, not available here, and the rest under AdamW);
# - images: any folder of images (UnlabeledImageFolder); the official run used Objects365 train
#   (~1.7M images), this config points at ImageNet-1k train (1.28M);
# - no validation loop (the official one reports the distillation loss at 64 cores every 5
#   epochs); model(mode='predict') gives per-image cosines for one;
# - mixed precision: pass --amp to tools/train.py (fp16 on a GPU, bf16 on the CPU), or set
#   optim_wrapper.type='AmpOptimWrapper' with dtype='bfloat16' as the official run.
_base_ = 'mmpretrain::_base_/default_runtime.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# The teacher: mmpretrain's VisionTransformer in DINOv3 ViT-B/16's layout as far as it goes
# (width 768, 12 blocks of 12 heads, MLP 3072, patch 16, class token, LayerScale, LayerNorm eps
# 1e-5, final norm, all tokens out). DINOv3 itself has no learned position embedding (it uses
# RoPE) and 4 register tokens after the class token, which this ViT cannot express: its
# pos_embed must be zero in a converted checkpoint, and the features then differ from DINOv3's.
# For the exact teacher, register a backbone that wraps DINOv3 (returning all tokens, or
# (class, patches)) and set teacher_num_register_tokens=4. Put the teacher weights, in the
# teacher's key layout, at e.g. checkpoints/dinov3-vitb16_teacher.pth and train with
#   --cfg-options model.teacher_ckpt=checkpoints/dinov3-vitb16_teacher.pth
# (teacher_ckpt_prefix selects them inside a whole-model checkpoint). Without a teacher
# checkpoint training stops with an error (allow_random_teacher=True is for smoke tests only).
teacher = dict(
    type='mmpretrain.VisionTransformer',
    arch='base',
    img_size=256,
    patch_size=16,
    qkv_bias=True,
    norm_cfg=dict(type='LN', eps=1e-5),
    layer_scale_init_value=1e-5,
    final_norm=True,
    with_cls_token=True,
    out_type='raw')

model = dict(
    type='mmeffattn.VECADistiller',
    student=dict(
        type='mmeffattn.VECA',
        arch='small',
        out_type='raw',
        nested_dropout=True,
        out_proj_dims=768,  # the official output projection to the teacher width
        drop_path_rate=0.0),
    teacher=teacher,
    teacher_ckpt=None,
    teacher_ckpt_prefix=None,
    allow_random_teacher=False,
    teacher_num_register_tokens=0,
    # official init_patch_from_dinov3: copied when the shapes match (VECA-B, not VECA-S)
    init_student_patch_embed=('patch_embed.projection', 'patch_embed.proj'),
    loss_weights=dict(global_cos=1.0, patch_cos=1.0, patch_mse=1.0),
    norm_eps=1e-6,
    save_teacher=False,  # checkpoints hold the student only; the teacher comes from teacher_ckpt
    data_preprocessor=dict(
        type='mmpretrain.SelfSupDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        to_rgb=True))

# data: resize the short side to 288 (bicubic), random 256 crop, horizontal flip,
# TrivialAugmentWide, ImageNet mean/std (veca/data.py, training transform)
data_root = 'data/imagenet/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=288, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='RandomCrop', crop_size=256),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='NumpyToPIL', to_rgb=True),
    dict(type='torchvision/TrivialAugmentWide'),
    dict(type='PILToNumpy', to_bgr=True),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type='mmeffattn.UnlabeledImageFolder',
        data_root=data_root,
        data_prefix=dict(img_path='train'),
        pipeline=train_pipeline))
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.015))
param_scheduler = [
    # per iteration, as the official LambdaLR: lr_min -> lr over 25 epochs, then cosine to lr_min
    dict(type='LinearLR', start_factor=5e-5 / 4e-4, end_factor=1.0, by_epoch=True, begin=0,
         end=25, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=110, eta_min=5e-5, by_epoch=True, begin=25, end=135,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=135)
auto_scale_lr = dict(base_batch_size=768)

# unused core chunks (nested budgets below 64) get no gradient
find_unused_parameters = True

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='CheckpointHook', interval=5, max_keep_ckpts=3))
randomness = dict(seed=42, diff_rank_seed=True)
