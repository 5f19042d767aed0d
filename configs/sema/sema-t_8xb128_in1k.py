# SEMA-T image classification on ImageNet-1k, 300 epochs, 8 GPUs x 128 images (MLLA's recipe:
# AdamW lr 1e-3 for batch 1024, weight decay 0.05, cosine with 20 warm-up epochs, RandAugment,
# Mixup 0.8 / CutMix 1.0, label smoothing 0.1, random erasing 0.25, drop path 0.2; an EMA of the
# weights, decay 0.9996 per 4096 images, i.e. momentum 1e-4 per step at batch 1024, which
# validation, test and checkpoints use; MESA: from epoch 75 on, a soft cross-entropy towards the
# EMA model's predictions, weight 1.0 for T).
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

model = dict(
    type='mmeffattn.MESAClassifier',  # mmpretrain's ImageClassifier + the MESA term
    backbone=dict(
        _delete_=True,
        type='mmeffattn.SEMA',
        arch='tiny',
        attn_type='sema',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(3, )),
    head=dict(in_channels=512))

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=1e-3), clip_grad=dict(max_norm=5.0))
auto_scale_lr = dict(base_batch_size=1024)

custom_hooks = [
    dict(type='MESAHook', momentum=1e-4, update_buffers=True, mesa_weight=1.0, start_ratio=0.25,
         priority='ABOVE_NORMAL'),
]
