# The demo (tools/demo.py): Mask R-CNN + SEMA-T, the recipe of configs/mask_rcnn_sema_t_3x.py
# with a short schedule that fits a CPU, trained from scratch on the synthetic shapes dataset that
# `python -m mmeffattn.datasets.synthetic_shapes data/shapes` generates (no download).
_base_ = '../mask_rcnn_sema_t_3x.py'

data_root = 'data/shapes/'
metainfo = dict(
    classes=('circle', 'square', 'triangle', 'star'),
    palette=[(220, 20, 60), (0, 130, 200), (60, 180, 75), (255, 200, 0)])
num_classes = 4
img_scale = (224, 224)

model = dict(
    # no ImageNet weights: train the backbone from scratch; lighter drop path for a short run
    backbone=dict(drop_path_rate=0.1, init_cfg=None),
    roi_head=dict(
        bbox_head=dict(num_classes=num_classes),
        # On a CPU the mask head dominates the cost (4 convs at 14x14 per positive RoI): the demo
        # keeps its shape but halves its width. Everything else is the real model.
        mask_head=dict(num_classes=num_classes, conv_out_channels=128)),
    # fewer proposals and RoI samples than COCO's 1000/512: the images hold 1-5 objects
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300)))

# the 3x recipe's multi-scale training, scaled down to ~224 px (the images are 256x256)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoiceResize', scales=[(192, 192), (224, 224), (256, 256)], keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]

train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=True,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val2017.json',
                 data_prefix=dict(img='val2017/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[5], gamma=0.1),
]
# from scratch and a short schedule: a larger step than the 1e-4 used with ImageNet weights
optim_wrapper = dict(optimizer=dict(lr=5e-4), clip_grad=dict(max_norm=10.0))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=2))
