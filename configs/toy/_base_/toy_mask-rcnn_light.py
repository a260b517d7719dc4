# Mask R-CNN heads slimmed for CPU toy runs (FPN/heads 64 channels, fewer proposals and sampled
# RoIs, half of them positive); the real
# configs use mmdet's standard heads.
_base_ = '../../_base_/models/mask-rcnn_fpn.py'
model = dict(
    neck=dict(out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=3),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(num_convs=2, in_channels=64, conv_out_channels=64, num_classes=3)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(sampler=dict(num=64, pos_fraction=0.5))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300)))
