# UperNet + VECA-B on PASCAL Context 59: the recipe of
# veca-s_upernet_8xb2-80k_pascal-context-59-480x480.py with the base trunk (768 channels), drop
# path 0.2 (as veca-b_upernet_8xb2-160k_ade20k-512x512.py).
_base_ = './veca-s_upernet_8xb2-80k_pascal-context-59-480x480.py'

embed_dims = 768
model = dict(backbone=dict(arch='base', drop_path_rate=0.2),
             decode_head=dict(in_channels=[embed_dims] * 4),
             auxiliary_head=dict(in_channels=embed_dims))
