# MILA-T (MLLA-T: Mamba-inspired linear attention, ELU+1 kernel, RoPE, LePE), the baseline SEMA
# is compared with: the same recipe as ../sema/mask-rcnn_sema-t_fpn_1x_coco.py,
# built as the registered mmeffattn.MILA (attn_type='linear').
_base_ = '../sema/mask-rcnn_sema-t_fpn_1x_coco.py'

model = dict(backbone=dict(type='mmeffattn.MILA', attn_type='linear'))
