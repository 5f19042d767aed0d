# RetinaNet + SEMA-T, 1x schedule. Stages 1-3 feed the FPN (as mmdet's Swin RetinaNet does), so
# no backbone output goes unused. AdamW lr 1e-4, weight decay 0.05, no decay on norms.
# mmdet's own RetinaNet test-time augmentation (3 scales x flip, boxes merged by NMS) rides
# along as tta_model/tta_pipeline; `python tools/test.py CONFIG CKPT --tta` switches it on.
_base_ = ['mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
          'mmdet::retinanet/retinanet_tta.py']

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # ImageNet-1k backbone weights; see mask-rcnn_sema-t_fpn_1x_coco.py

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.SEMA',
        arch='tiny',
        attn_type='sema',
        window_size=7,
        drop_path_rate=0.1,
        out_indices=(1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[128, 256, 512], start_level=0, num_outs=5))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
