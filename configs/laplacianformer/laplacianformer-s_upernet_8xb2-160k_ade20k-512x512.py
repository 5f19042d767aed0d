# UperNet + LaplacianFormer-S on ADE20K, 160k iterations, 512x512 crops:
# laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py with the small arch and drop path 0.2.
_base_ = './laplacianformer-t_upernet_8xb2-160k_ade20k-512x512.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.2))
