# mask-rcnn_mavit-b_fpn_ms-3x_coco: MAViT-B (base), over the S config.
# Recipe: qhfan/MALA detect/configs/MALA/maskrcnn_b_3x.py.
# Deviations from it: none.
_base_ = './mask-rcnn_mavit-s_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_B.pth')),
    neck=dict(in_channels=[96, 192, 384, 512]))
