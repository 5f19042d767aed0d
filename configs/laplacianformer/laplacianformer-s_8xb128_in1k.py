# LaplacianFormer-S on ImageNet-1k: the recipe of laplacianformer-t_8xb128_in1k.py (SOFT's:
# AdamW lr 1e-3 for batch 1024, weight decay 0.05, 10 warm-up epochs then cosine, clipping 1.0,
# drop path 0.1) with the small arch.
_base_ = './laplacianformer-t_8xb128_in1k.py'

model = dict(backbone=dict(arch='small'))
