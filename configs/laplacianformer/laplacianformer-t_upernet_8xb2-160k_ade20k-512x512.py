# UperNet + LaplacianFormer-T on ADE20K, 160k iterations, 512x512 crops, 8 GPUs x 2 images.
# Optimizer of the Swin UperNet recipe: AdamW lr 6e-5, weight decay 0.01, no decay on norms,
# linear warm-up 1500 iterations then poly decay. Drop path 0.1.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # ImageNet-1k backbone weights (laplacianformer-t_8xb128_in1k.py)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmeffattn.LaplacianFormer',
        arch='tiny',
        kernel='laplacian',
        lam=4.0,
        ns_iters=20,
        eps=0.01,
        # the paper's injective map on the kernel similarities, per-landmark statistics
        # (landmarks on a fixed 7x7 grid: the same slots at every size, so ImageNet weights load)
        whitening='kernel',
        whitening_stats='per_landmark',
        feature_scale=None,  # lam is lambda on the projected features, as the paper's
        pinv_solver='newton_schulz',  # 'cg': the solver ablation
        # with whitening_stats='per_head' (sr x sr cells): the official CUDA inverse takes
        # <= 128 landmarks; larger maps pool larger cells
        # (uncapped: 16 x 16 = 256 landmarks per stage for a 512x512 crop)
        max_landmarks=128,
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    decode_head=dict(in_channels=[64, 128, 320, 512], num_classes=150),
    auxiliary_head=dict(in_channels=320, num_classes=150))
