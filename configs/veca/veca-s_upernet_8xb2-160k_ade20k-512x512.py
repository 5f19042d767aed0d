# UperNet + VECA-S on ADE20K, 160k iterations, 512x512 crops, 8 GPUs x 2 images: the stride
# 4/8/16/32 pyramid of blocks 2, 5, 8, 11. Optimizer as the Swin/MLLA UperNet recipe (AdamW lr
# 6e-5, weight decay 0.01, no decay on norms and the core bank, warm-up then poly). Cores as in
# mask-rcnn_veca-s_fpn_1x_coco.py (nested dropout in training, num_cores in evaluation).
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # see mask-rcnn_veca-s_fpn_1x_coco.py
embed_dims = 384

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmeffattn.VECA',
        arch='small',
        num_cores=64,
        nested_dropout=True,
        out_type='pyramid',
        out_indices=(2, 5, 8, 11),
        drop_path_rate=0.1,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[embed_dims] * 4, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=150))

find_unused_parameters = True  # nested core dropout: unused bank chunks have no gradient

optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'norm': dict(decay_mult=0.), 'core_tokens': dict(decay_mult=0.),
                     'core_coords': dict(decay_mult=0.), 'coord_head.alpha': dict(decay_mult=0.)},
        _delete_=True))
