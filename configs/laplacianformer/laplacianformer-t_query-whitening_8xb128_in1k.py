# LaplacianFormer-T on ImageNet-1k, whitening ablation: DiagonalWhitening of the projected queries
# before the kernel instead of the paper's whitening of the kernel-similarity vectors, with the
# features divided by sqrt(head_dim) (lam then acts as lam * sqrt(head_dim) on the projections):
# the model of this package before whitening='kernel' (its checkpoints load here).
_base_ = './laplacianformer-t_8xb128_in1k.py'

model = dict(backbone=dict(whitening='query', feature_scale='sqrt_head_dim'))
