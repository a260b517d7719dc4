# Toy Mask R-CNN with InLine-PVT-T (random init) on the generated toy COCO; CPU, a few minutes.
_base_ = [
    './_base_/toy_mask-rcnn_light.py', './_base_/toy_coco_instance.py',
    './_base_/toy_schedule_det.py', '../_base_/default_runtime_det.py',
]
model = dict(
    backbone=dict(_delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.0),
    neck=dict(in_channels=[64, 128, 320, 512]))
default_hooks = dict(logger=dict(type='LoggerHook', interval=10))
