# UperNet + WeightFormer-T on ADE20K, 160k iterations, 512x512 crops, 8 GPUs x 2 images: the
# stride 4/8/16/32 pyramid of blocks 3, 7, 11, 16. Optimizer as the Swin/MLLA UperNet recipe
# (AdamW lr 6e-5, weight decay 0.01, no decay on norms, warm-up then poly).
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # see ../weightformer/mask-rcnn_weightformer-t_fpn_1x_coco.py
embed_dims = 192

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmeffattn.WeightFormer',
        arch='tiny',
        out_type='pyramid',
        out_indices=(3, 7, 11, 16),
        drop_path_rate=0.1,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[embed_dims] * 4, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dims, num_classes=150))
