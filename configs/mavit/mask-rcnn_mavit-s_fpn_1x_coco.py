# mask-rcnn_mavit-s_fpn_1x_coco: MAViT-S (small), over the T config.
# Recipe: qhfan/MALA detect/configs/MALA/maskrcnn_s_1x.py.
# Deviations from it: none.
_base_ = './mask-rcnn_mavit-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_S.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
