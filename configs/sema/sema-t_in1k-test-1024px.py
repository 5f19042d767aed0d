# SEMA-T on ImageNet-1k evaluated at 1024x1024 with the weights of the 224x224 classifier, no
# fine-tuning (the SEMA paper's resolution-robustness experiment). The test pipeline keeps the
# 224 config's resize/crop ratio: bicubic short-side resize to 1170 (= 1024 * 256 / 224), then
# centre crop 1024. The windows stay 7x7: 37x37 windows at stride 4.
#   python tools/test.py configs/sema/sema-t_in1k-test-1024px.py SEMA_T_224_CKPT
_base_ = './sema-t_8xb128_in1k.py'

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=1170, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=1024),
    dict(type='PackInputs'),
]
val_dataloader = dict(batch_size=16, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
