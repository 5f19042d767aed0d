# LaplacianFormer-T on ImageNet-1k, the paper's solver ablation: the landmark system
# (K(L, L) + eps I) X = K(L, K) V solved by conjugate gradients instead of Newton-Schulz
# (reference PyTorch implementation, mmeffattn/models/layers/linear_solve.py). Recipe otherwise
# as laplacianformer-t_8xb128_in1k.py.
_base_ = './laplacianformer-t_8xb128_in1k.py'

model = dict(backbone=dict(pinv_solver='cg', cg_iters=20, cg_tol=1e-6))
