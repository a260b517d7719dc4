# Toy RetinaNet with MAViT-T (random init) on the generated toy COCO.
_base_ = [
    './_base_/toy_retinanet_light.py', './_base_/toy_coco_detection.py',
    './_base_/toy_schedule_det.py', '../_base_/default_runtime_det.py',
]
model = dict(
    # out_norm=False keeps the toy runs as measured in README.md. It was chosen because with the
    # output LayerNorms the toy Mask R-CNN barely learned; the cause was channels-last-strided
    # backbone outputs read wrongly by mmcv's RoIAlign (fixed: the outputs are now contiguous, and
    # with out_norm=True the toy Mask R-CNN reaches bbox AP50 0.95). See docs/from_scratch.md.
    backbone=dict(_delete_=True, type='MAViT', arch='tiny', drop_path_rate=0.0, out_norm=False,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 256, 512], start_level=0))
default_hooks = dict(logger=dict(type='LoggerHook', interval=10))
