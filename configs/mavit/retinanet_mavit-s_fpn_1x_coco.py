# retinanet_mavit-s_fpn_1x_coco: MAViT-S (small), over the T config.
# Recipe: qhfan/MALA detect/configs/MALA/retinanet_s_1x.py.
# Deviations from it: none.
_base_ = './retinanet_mavit-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_S.pth')),
    neck=dict(in_channels=[128, 320, 512], start_level=0))
