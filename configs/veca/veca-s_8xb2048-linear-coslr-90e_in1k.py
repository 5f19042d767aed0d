# Linear probing of VECA-S on ImageNet-1k: the frozen trunk (patch embedding, core bank, all 12
# blocks and the final norm) at a fixed 64 cores, core 0 as the image feature, a parameter-free
# BatchNorm and one linear layer. The MAE linear-probing protocol as mmpretrain has it
# (mae/benchmarks/vit-base-p16_8xb2048-linear-coslr-90e_in1k.py): LARS lr 6.4 for 16384 images,
# no weight decay, 10 warm-up epochs then cosine over 90 epochs; RandomResizedCrop + flip. The
# official repository ships no probing recipe. Set `pretrained` (see veca-s_8xb128_in1k.py):
# probing random weights measures nothing.
_base_ = 'mmpretrain::mae/benchmarks/vit-base-p16_8xb2048-linear-coslr-90e_in1k.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None
embed_dims = 384
depth = 12

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.VECA',
        arch='small',
        num_cores=64,
        nested_dropout=False,  # frozen: evaluate one budget (change num_cores to probe others)
        out_type='global',
        frozen_stages=depth,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(type='ClsBatchNormNeck', input_features=embed_dims),
    head=dict(_delete_=True, type='LinearClsHead', num_classes=1000, in_channels=embed_dims,
              loss=dict(type='CrossEntropyLoss'),
              init_cfg=[dict(type='TruncNormal', layer='Linear', std=0.01)]))

# the MAE base asks for AmpOptimWrapper, which mmengine refuses without a GPU; tools/train.py
# --amp turns mixed precision on where it runs
optim_wrapper = dict(type='OptimWrapper')
