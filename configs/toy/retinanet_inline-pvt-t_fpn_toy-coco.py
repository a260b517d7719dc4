# Toy RetinaNet with InLine-PVT-T (random init) on the generated toy COCO.
_base_ = [
    './_base_/toy_retinanet_light.py', './_base_/toy_coco_detection.py',
    './_base_/toy_schedule_det.py', '../_base_/default_runtime_det.py',
]
model = dict(
    backbone=dict(_delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.0,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512], start_level=0))
default_hooks = dict(logger=dict(type='LoggerHook', interval=10))
