# Mask R-CNN + LaplacianFormer-T, 1x schedule (12 epochs), COCO instance segmentation, batch 16
# (8 GPUs x 2 images). Optimizer as the Swin/SEMA configs: AdamW lr 1e-4, weight decay 0.05
# (none on norms); drop path 0.1.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

# ImageNet-1k weights of the backbone (from laplacianformer-t_8xb128_in1k.py);
# None trains from scratch. Set with --cfg-options model.backbone.init_cfg.checkpoint=PATH.
pretrained = None

model = dict(
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
        # (uncapped, ~1000 landmarks per stage at 800x1333 cost ~740 GMACs of Newton-Schulz)
        max_landmarks=128,
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
