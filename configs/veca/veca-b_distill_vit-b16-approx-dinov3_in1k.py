# VECA-B pretraining by feature distillation from a frozen ViT-B/16 teacher that approximates the
# paper's DINOv3 ViT-B/16 (no RoPE, no register tokens: see the VECA-S config), the official
# run's default family: the VECA-S recipe with the base student. Its width equals the teacher's, so
# there is no output projection, and its patch projection starts from the teacher's.
_base_ = './veca-s_distill_vit-b16-approx-dinov3_in1k.py'

model = dict(student=dict(arch='base', out_proj_dims=None))
