# SEMA-T on ImageNet-1k evaluated at 448x448 with the weights of the 224x224 classifier, no
# fine-tuning (the SEMA paper's resolution-robustness experiment). The test pipeline keeps the
# 224 config's resize/crop ratio: bicubic short-side resize to 512 (= 448 * 256 / 224), then
# centre crop 448. The windows stay 7x7: 16x16 windows at stride 4.
#   python tools/test.py configs/sema/sema-t_in1k-test-448px.py SEMA_T_224_CKPT
_base_ = './sema-t_8xb128_in1k.py'

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=512, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=448),
    dict(type='PackInputs'),
]
val_dataloader = dict(batch_size=64, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
