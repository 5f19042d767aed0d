# RetinaNet + LaplacianFormer-T, 1x schedule. Stages 1-3 feed the FPN (as mmdet's Swin RetinaNet
# does). AdamW lr 1e-4, weight decay 0.05 (none on norms), drop path 0.1.
# mmdet's own RetinaNet test-time augmentation (3 scales x flip, boxes merged by NMS) rides
# along as tta_model/tta_pipeline; `python tools/test.py CONFIG CKPT --tta` switches it on.
_base_ = ['mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
          'mmdet::retinanet/retinanet_tta.py']

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # ImageNet-1k backbone weights; see mask-rcnn_laplacianformer-t_fpn_1x_coco.py

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
        out_indices=(1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
