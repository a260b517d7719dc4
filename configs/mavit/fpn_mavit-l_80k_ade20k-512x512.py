# fpn_mavit-l_80k_ade20k-512x512: MAViT-L (large), over the T config.
# Recipe: qhfan/MALA segmentation/configs/MALA/FPN_l_1x.py.
# Deviations from it: none.
_base_ = './fpn_mavit-t_80k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_L.pth')),
    neck=dict(in_channels=[96, 192, 448, 640]))
