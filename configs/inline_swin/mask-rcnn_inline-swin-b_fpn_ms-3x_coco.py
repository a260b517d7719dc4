# mask-rcnn_inline-swin-b_fpn_ms-3x_coco: InLineSwin-B (base), over the T config.
# Recipe: our choice (no setting in the paper), following
#   SwinTransformer/Swin-Transformer-Object-Detection
#   configs/swin/mask_rcnn_swin_small_patch4_window7_mstrain_480-800_adamw_3x_coco.py.
# Deviations from it: Swin released no Mask R-CNN Swin-B: drop path 0.3 as Swin-B's Cascade 3x.
_base_ = './mask-rcnn_inline-swin-t_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_b.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
