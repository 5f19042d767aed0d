# Linear probing of VECA-B: the recipe of veca-s_8xb2048-linear-coslr-90e_in1k.py with the base
# trunk (768 channels).
_base_ = './veca-s_8xb2048-linear-coslr-90e_in1k.py'

embed_dims = 768
model = dict(backbone=dict(arch='base'), neck=dict(input_features=embed_dims),
             head=dict(in_channels=embed_dims))
