# Mask R-CNN + FPN (mmdet's), backbone filled in by each config.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
model = dict(backbone=dict(_delete_=True, type='MAViT', arch='tiny'),
             neck=dict(in_channels=[64, 128, 256, 512]))
