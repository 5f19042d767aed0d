# RetinaNet + WeightFormer-T, 1x schedule: the stride 4/8/16/32 pyramid of the isotropic trunk,
# FPN from stride 8 with extra levels on its input (as RetinaNet R-50). AdamW lr 1e-4, wd 0.05.
# mmdet's own RetinaNet test-time augmentation (3 scales x flip, boxes merged by NMS) rides
# along as tta_model/tta_pipeline; `python tools/test.py CONFIG CKPT --tta` switches it on.
_base_ = ['mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
          'mmdet::retinanet/retinanet_tta.py']

custom_imports = dict(imports=['mmeffattn'], allow_failed_imports=False)

pretrained = None  # see mask-rcnn_weightformer-t_fpn_1x_coco.py
embed_dims = 192

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmeffattn.WeightFormer',
        arch='tiny',
        out_type='pyramid',
        out_indices=(3, 7, 11, 16),
        drop_path_rate=0.1,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=[embed_dims] * 4, start_level=1, add_extra_convs='on_input',
              num_outs=5))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}, _delete_=True),
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05))

auto_scale_lr = dict(enable=False, base_batch_size=16)
