# retinanet_mavit-l_fpn_1x_coco: MAViT-L (large), over the T config.
# Recipe: qhfan/MALA detect/configs/MALA/retinanet_l_1x.py.
# Deviations from it: none.
_base_ = './retinanet_mavit-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_L.pth')),
    neck=dict(in_channels=[192, 448, 640], start_level=0))
