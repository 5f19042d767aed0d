# MILA-B (MLLA-B) image classification on ImageNet-1k: MILA-S's recipe (./mila-s_8xb64_in1k.py,
# 8 GPUs x 64 images, lr 5e-4) with the official cfgs/mlla_b.yaml settings: drop path 0.5,
# MESA weight 2.0.
# Official MLLA-B weights (the authors' layout, converted on load into the backbone, whose
# conversion drops the official classifier head): init_cfg=dict(type='Pretrained', checkpoint=URL),
#   URL = https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1
# (docs/user_guides/checkpoints.md).
_base_ = './mila-s_8xb64_in1k.py'

model = dict(backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=768))

custom_hooks = [
    dict(type='MESAHook', momentum=1e-4, update_buffers=True, mesa_weight=2.0, start_ratio=0.25,
         priority='ABOVE_NORMAL'),
]
