# cascade-mask-rcnn_inline-swin-b_fpn_ms-3x_coco: InLineSwin-B (base), over the T config.
# Recipe: SwinTransformer/Swin-Transformer-Object-Detection
#   configs/swin/cascade_mask_rcnn_swin_base_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py.
# Deviations from it: none.
_base_ = './cascade-mask-rcnn_inline-swin-t_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_b.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
