# MILA-S (MLLA-S) image classification on ImageNet-1k: the recipe of ./mila-t_8xb128_in1k.py with
# the official cfgs/mlla_s.yaml settings: 8 GPUs x 64 images (lr 5e-4 for batch 512, the same
# linear rule as T's 1e-3 for 1024), drop path 0.3, MESA weight 1.5.
# Official MLLA-S weights (the authors' layout, converted on load into the backbone, whose
# conversion drops the official classifier head): init_cfg=dict(type='Pretrained', checkpoint=URL),
#   URL = https://cloud.tsinghua.edu.cn/f/0e5d0b1409d540aaa80c/?dl=1
# (docs/user_guides/checkpoints.md).
_base_ = './mila-t_8xb128_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.3), head=dict(in_channels=512))

train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64)
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=512)

custom_hooks = [
    dict(type='MESAHook', momentum=1e-4, update_buffers=True, mesa_weight=1.5, start_ratio=0.25,
         priority='ABOVE_NORMAL'),
]
