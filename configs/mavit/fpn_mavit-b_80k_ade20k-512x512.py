# fpn_mavit-b_80k_ade20k-512x512: MAViT-B (base), over the T config.
# Recipe: qhfan/MALA segmentation/configs/MALA/FPN_b_1x.py.
# Deviations from it: none.
_base_ = './fpn_mavit-t_80k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_B.pth')),
    neck=dict(in_channels=[96, 192, 384, 512]))
