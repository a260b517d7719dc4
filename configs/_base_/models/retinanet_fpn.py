# RetinaNet + FPN (mmdet's: start_level=1, add_extra_convs='on_input', 5 levels).
_base_ = 'mmdet::_base_/models/retinanet_r50_fpn.py'
model = dict(backbone=dict(_delete_=True, type='MAViT', arch='tiny'),
             neck=dict(in_channels=[64, 128, 256, 512], start_level=1, add_extra_convs='on_input'))
