# mask-rcnn_inline-swin-s_fpn_1x_coco: InLineSwin-S (small), over the T config.
# Recipe: our choice (no setting in the paper), following
#   SwinTransformer/Swin-Transformer-Object-Detection
#   configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py.
# Deviations from it: single-scale training as the papers' 1x tables (Swin's 1x config trains
#   multi-scale 480-800 with crops); Swin released no Swin-S 1x: drop path 0.2 as Swin-S's Mask
#   R-CNN 3x.
_base_ = './mask-rcnn_inline-swin-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_s.pth')))
