# SEMA-T on ImageNet-1k evaluated at 672x672 with the weights of the 224x224 classifier, no
# fine-tuning (the SEMA paper's resolution-robustness experiment). The test pipeline keeps the
# 224 config's resize/crop ratio: bicubic short-side resize to 768 (= 672 * 256 / 224), then
# centre crop 672. The windows stay 7x7: 24x24 windows at stride 4.
#   python tools/test.py configs/sema/sema-t_in1k-test-672px.py SEMA_T_224_CKPT
_base_ = './sema-t_8xb128_in1k.py'

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=768, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=672),
    dict(type='PackInputs'),
]
val_dataloader = dict(batch_size=32, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
