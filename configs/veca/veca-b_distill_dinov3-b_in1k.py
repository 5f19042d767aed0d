# VECA-B pretraining by feature distillation from a frozen DINOv3 ViT-B/16 (the official run's
# default family): the VECA-S recipe with the base student. Its width equals the teacher's, so
# there is no output projection, and its patch projection starts from the teacher's.
_base_ = './veca-s_distill_dinov3-b_in1k.py'

model = dict(student=dict(arch='base', out_proj_dims=None))
