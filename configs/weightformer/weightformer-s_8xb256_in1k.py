# WeightFormer-S on ImageNet-1k: the recipe of weightformer-t_8xb256_in1k.py (official cfg/wfm_s.yaml) with drop path 0.2.
_base_ = './weightformer-t_8xb256_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.2), head=dict(in_channels=384))
