# UperNet + SEMA-T on ADE20K, 160k iterations, 512x512 crops, 8 GPUs x 2 images.
# Optimizer as MLLA's segmentation config (the Swin recipe): AdamW lr 6e-5, weight decay 0.01, no
# decay on norms, linear warm-up 1500 iterations then poly decay. Drop path 0.3 (as Swin-T).
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # ImageNet-1k backbone weights (configs/sema/sema-t_8xb128_in1k.py)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmeffattn.SEMA',
        arch='tiny',
        attn_type='sema',
        window_size=7,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))
