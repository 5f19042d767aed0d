# VECA-B on ImageNet-1k: the fine-tuning recipe of veca-s_8xb128_in1k.py with the base trunk
# (768 channels) and MAE's ViT-B layer decay 0.65.
_base_ = './veca-s_8xb128_in1k.py'

model = dict(backbone=dict(arch='base'), head=dict(in_channels=768))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.65))
