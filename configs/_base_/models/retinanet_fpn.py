# RetinaNet + FPN (mmdet's base: add_extra_convs='on_input', 5 levels). FPN starts at the backbone's
# stage 2: the backbone returns stages 2-4 only (out_indices=(1, 2, 3), start_level=0, as mmdet's
# Swin RetinaNet), so no output norm of an unused stage is left without a gradient under DDP.
_base_ = 'mmdet::_base_/models/retinanet_r50_fpn.py'
model = dict(backbone=dict(_delete_=True, type='MAViT', arch='tiny', out_indices=(1, 2, 3)),
             neck=dict(in_channels=[128, 256, 512], start_level=0, add_extra_convs='on_input'))
