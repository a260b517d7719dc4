# Cascade Mask R-CNN + FPN with 4conv1fc box heads and GIoU loss (the 3x recipe of Swin/ConvNeXt/
# MALA); SyncBN in the heads (reverted to plain BN by mmengine in a single, non-distributed
# process).
_base_ = 'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py'

model = dict(
    backbone=dict(_delete_=True, type='MAViT', arch='tiny'),
    neck=dict(in_channels=[64, 128, 256, 512]),
    roi_head=dict(bbox_head=[
        dict(type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1, in_channels=256,
             conv_out_channels=256, fc_out_channels=1024, roi_feat_size=7, num_classes=80,
             bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                             target_stds=stds),
             reg_class_agnostic=False, reg_decoded_bbox=True,
             norm_cfg=dict(type='SyncBN', requires_grad=True),
             loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
             loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
        for stds in ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067])
    ]))
