# UperNet + VECA-S on PASCAL Context (59 classes, background ignored), 80k iterations, 480x480
# crops, 8 GPUs x 2 images. The VECA paper reports 57.46 mIoU on PASCAL Context for its dense
# features but we did not find its segmentation schedule; this is the usual UperNet PASCAL Context
# 59 schedule (mmseg's 80k / 480x480 / batch 16) with the optimizer of
# veca-s_upernet_8xb2-160k_ade20k-512x512.py (AdamW lr 6e-5, linear warm-up 1500 iterations,
# poly). Data: mmseg's PascalContextDataset59 layout under data/VOCdevkit/VOC2010/.
# The dataset entries are those of mmseg's _base_/datasets/pascal_context_59.py, written out:
# mmengine does not allow two bases that both define the dataloaders.
_base_ = './veca-s_upernet_8xb2-160k_ade20k-512x512.py'

dataset_type = 'PascalContextDataset59'
data_root = 'data/VOCdevkit/VOC2010/'
img_scale = (520, 520)
crop_size = (480, 480)
num_classes = 59
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=img_scale, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in img_ratios],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations')], [dict(type='PackSegInputs')]]),
]
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=num_classes),
    auxiliary_head=dict(num_classes=num_classes),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(320, 320)))

train_dataloader = dict(
    batch_size=2,
    dataset=dict(
        _delete_=True, type=dataset_type, data_root=data_root,
        data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClassContext'),
        ann_file='ImageSets/SegmentationContext/train.txt', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    dataset=dict(
        _delete_=True, type=dataset_type, data_root=data_root,
        data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClassContext'),
        ann_file='ImageSets/SegmentationContext/val.txt', pipeline=test_pipeline))
test_dataloader = val_dataloader

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=8000))
