# LaplacianFormer-T on ImageNet-1k, 300 epochs, 8 GPUs x 128 images, after SOFT's recipe
# (config/SOFT_*.yaml; the official LaplacianFormer code publishes no training script): AdamW
# lr 1e-3 for batch 1024, weight decay 0.05, 10 warm-up epochs then cosine to 5e-5, gradient
# clipping at 1.0; RandAugment, Mixup 0.8 / CutMix 1.0, label smoothing 0.1 and random erasing 0.25
# from the Swin base; drop path 0.1; an EMA of the weights (SOFT: decay 0.99996 per step), which
# validation, test and checkpoints use. Laplacian kernel, lambda 4 on the unscaled features, kernel
# whitening, 20 Newton-Schulz steps, eps 0.01. Ablations: laplacianformer-t_{cg,query-whitening}_*.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

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
        drop_path_rate=0.1,
        out_indices=(3, )),
    head=dict(in_channels=512))

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=1e-3), clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=10, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-5, by_epoch=True, begin=10),
]
auto_scale_lr = dict(base_batch_size=1024)

custom_hooks = [
    dict(type='EMAHook', momentum=4e-5, update_buffers=True, priority='ABOVE_NORMAL'),
]
