# UperNet + WeightFormer-S: the recipe of weightformer-t_upernet_8xb2-160k_ade20k-512x512.py with the small trunk (384 channels), drop path 0.2.
_base_ = './weightformer-t_upernet_8xb2-160k_ade20k-512x512.py'

embed_dims = 384
model = dict(backbone=dict(arch='small', drop_path_rate=0.2),
             decode_head=dict(in_channels=[embed_dims] * 4),
             auxiliary_head=dict(in_channels=embed_dims))
