# MILA-B (MLLA-B) image classification on ImageNet-1k: the recipe of ./mila-t_8xb128_in1k.py with
# the official cfgs/mlla_b.yaml settings: 8 GPUs x 64 images (lr 5e-4 for batch 512, the same
# linear rule as T's 1e-3 for 1024), drop path 0.5, MESA weight 2.0.
# Official MLLA-B weights (the authors' layout, converted on load into the backbone, whose
# conversion drops the official classifier head): init_cfg=dict(type='Pretrained', checkpoint=URL),
#   URL = https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1
# (docs/user_guides/checkpoints.md).
_base_ = './mila-t_8xb128_in1k.py'

model = dict(backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=768))

train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64)
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=512)

custom_hooks = [
    dict(type='MESAHook', momentum=1e-4, update_buffers=True, mesa_weight=2.0, start_ratio=0.25,
         priority='ABOVE_NORMAL'),
]
