# RetinaNet slimmed for CPU toy runs (FPN/head 64 channels, 2 head convs).
_base_ = '../../_base_/models/retinanet_fpn.py'
model = dict(
    neck=dict(out_channels=64),
    bbox_head=dict(in_channels=64, feat_channels=64, stacked_convs=2, num_classes=3))
