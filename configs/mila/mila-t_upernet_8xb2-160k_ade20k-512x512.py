# MILA-T (MLLA-T: Mamba-inspired linear attention, ELU+1 kernel, RoPE, LePE), the baseline SEMA
# is compared with: the same recipe as ../sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py,
# built as the registered mmeffattn.MILA (attn_type='linear').
_base_ = '../sema/sema-t_upernet_8xb2-160k_ade20k-512x512.py'

model = dict(backbone=dict(type='mmeffattn.MILA', attn_type='linear'))
